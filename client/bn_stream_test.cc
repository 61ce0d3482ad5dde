// GrpcPsClient against fake shards: BN over the gRPC stream (round trips,
// concurrent callers, codes, breaks and retries, deadlines, flow control,
// closing). BN over raw TCP: tests/bn_over_tcp_test.cc.

#include "client/grpc_ps_client.h"
#include "client/grpc_ps_client_testing.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bn/moments.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "gtest/gtest.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/codec.h"
#include "proto/limits.h"
#include "proto/sharding.h"

namespace bnps::client {
namespace {

using ::testing::HasSubstr;
using fakes::GrpcPsClientTest;
using fakes::BnMode;
using fakes::kShards;
using fakes::kWorkers;
using fakes::kJob;
using fakes::KeyOnShard;
using fakes::MakeMoments;

TEST_F(GrpcPsClientTest, BnExchangesRoundTrip) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options(/*worker=*/1));
  ASSERT_NE(client, nullptr);
  const bn::Moments local = MakeMoments(10, {1.0, -2.0, 3.5}, {4.0, 5.0, 6.0});
  absl::StatusOr<BnForwardResult> fwd = client->BnForward("bn1", 4, local);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->merged.count, 20);
  EXPECT_EQ(fwd->merged.mean, (std::vector<double>{2.0, -1.0, 4.5}));
  EXPECT_EQ(fwd->merged.m2, (std::vector<double>{8.0, 10.0, 12.0}));
  EXPECT_FALSE(fwd->running.has_value());  // not asked for
  EXPECT_EQ(fwd->contributors, kWorkers);
  fwd = client->BnForward("bn1", 5, local, /*want_running=*/true);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  ASSERT_TRUE(fwd->running.has_value());
  EXPECT_EQ(fwd->running->mean, fwd->merged.mean);
  EXPECT_EQ(fwd->running->var, (std::vector<double>(3, 1.0)));

  bn::BackwardSums sums{{1.0, 2.0, 3.0}, {-1.0, 0.5, 0.0}};
  absl::StatusOr<bn::BackwardSums> back = client->BnBackward("bn1", 4, sums);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sum_dy, (std::vector<double>{2.0, 4.0, 6.0}));
  EXPECT_EQ(back->sum_dy_xhat, (std::vector<double>{-2.0, 1.0, 0.0}));

  EXPECT_TRUE(client->BnRecal("bn2", 0, local).ok());
  absl::StatusOr<bn::RunningStats> pop = client->BnRecalFinish("bn2");
  ASSERT_TRUE(pop.ok()) << pop.status();
  EXPECT_EQ(pop->mean, (std::vector<double>{1, 2}));
  EXPECT_EQ(pop->var, (std::vector<double>{3, 4}));
  absl::StatusOr<bn::RunningStats> avg =
      client->BnLocalRunning("bn3", bn::RunningStats{{2, 4}, {6, 8}});
  ASSERT_TRUE(avg.ok()) << avg.status();
  EXPECT_EQ(avg->mean, (std::vector<double>{1, 2}));
  absl::StatusOr<bn::RunningStats> now = client->BnRunning("bn4", 2);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->mean, (std::vector<double>{5, 6}));
  EXPECT_EQ(now->var, (std::vector<double>{7, 8}));
  // Stats of the wrong width are a malformed answer.
  EXPECT_EQ(client->BnRunning("bn4", 3).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Each request went to the shard that owns its layer, with job and worker,
  // and ids never repeat on a stream.
  for (int s = 0; s < kShards; ++s) {
    std::set<uint64_t> ids;
    for (const proto::BnRequest& r : fakes_[s]->bn_requests()) {
      EXPECT_EQ(proto::ShardForKey(r.layer(), kShards), s) << r.layer();
      EXPECT_EQ(r.job(), kJob);
      EXPECT_EQ(r.worker(), 1);
      EXPECT_TRUE(ids.insert(r.id()).second) << "repeated id " << r.id();
      if (r.phase() == proto::BN_FORWARD) {
        EXPECT_EQ(r.want_running(), r.step() == 5) << r.step();
      }
    }
  }
  // Invalid local values are refused before anything is sent.
  EXPECT_EQ(client->BnForward("bn1", 5, bn::Moments{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      client->BnBackward("bn1", 5, bn::BackwardSums{{1}, {}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->BnForward("", 5, local).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->BnRunning("bn4", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, ConcurrentBnCallersGetTheirOwnResponses) {
  // Shard 0 answers in batches of 4, in reverse order of arrival.
  fakes_[0]->set_bn_mode(BnMode::kReverseBatches, 4);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  constexpr int kThreads = 6;  // 4 on shard 0, 2 on shard 1
  constexpr int kRounds = 25;
  std::vector<std::string> layers;
  for (int t = 0; t < 4; ++t) layers.push_back(KeyOnShard(0, "bn", t));
  for (int t = 0; t < 2; ++t) layers.push_back(KeyOnShard(1, "bn", t));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const double mark = t * 1000 + round;
        const bn::Moments local = MakeMoments(t + 1, {mark, -mark}, {1.0, 2.0});
        absl::StatusOr<BnForwardResult> fwd =
            client->BnForward(layers[t], round, local);
        if (!fwd.ok() ||
            fwd->merged.mean != std::vector<double>{mark + 1, 1 - mark} ||
            fwd->merged.count != 2 * (t + 1)) {
          ADD_FAILURE() << "thread " << t << " round " << round << ": "
                        << (fwd.ok() ? "wrong response"
                                     : fwd.status().ToString());
          ++failures;
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(fakes_[0]->bn_requests().size(), 4u * kRounds);
  EXPECT_EQ(fakes_[0]->bn_streams(), 1);  // one stream carried all of them
  EXPECT_EQ(fakes_[1]->bn_streams(), 1);
}

TEST_F(GrpcPsClientTest, BnResponseCodeBecomesStatus) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward("fail.bn", 0, MakeMoments(2, {1}, {1}));
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fwd.status().message(), HasSubstr("layer is not ready"));
  EXPECT_THAT(fwd.status().message(), HasSubstr("fail.bn"));
  // The stream survives an error response.
  EXPECT_TRUE(client->BnForward("ok.bn", 0, MakeMoments(2, {1}, {1})).ok());
}

// Protobuf parses a response whole, so bytes it cannot parse have no id:
// they drop the stream, and the call is retried once on a fresh one.
TEST_F(GrpcPsClientTest, UnreadableBnResponseDropsTheStream) {
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kUnreadable);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward(layer, 0, MakeMoments(2, {1}, {1}));
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kUnavailable)
      << fwd.status();
  EXPECT_THAT(fwd.status().message(), HasSubstr("malformed BN response"));
  EXPECT_THAT(fwd.status().message(), HasSubstr(layer));
  EXPECT_EQ(fakes_[0]->bn_streams(), 2);
}

TEST_F(GrpcPsClientTest, BnCallRetriesOnceOnAFreshStream) {
  const std::string layer = KeyOnShard(1, "bn");
  fakes_[1]->set_bn_mode(BnMode::kBreakFirst);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward(layer, 0, MakeMoments(2, {1}, {1}));
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fakes_[1]->bn_streams(), 2);
  EXPECT_EQ(fakes_[1]->bn_requests().size(), 2u);
}

TEST_F(GrpcPsClientTest, BnStreamEndedWhileIdleIsReplacedByTheNextCall) {
  // The server answers the first call and then ends the stream while the
  // client has nothing outstanding. The next call finds the end and repeats
  // itself on a fresh stream.
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kEndAfterAnswer);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<BnForwardResult> fwd =
        client->BnForward(layer, step, MakeMoments(2, {1.0 * step}, {1}));
    ASSERT_TRUE(fwd.ok()) << "step " << step << ": " << fwd.status();
    EXPECT_EQ(fwd->merged.mean, std::vector<double>{step + 1.0});
    if (step == 0) absl::SleepFor(absl::Milliseconds(50));  // let it end
  }
  EXPECT_EQ(fakes_[0]->bn_streams(), 2);
}

TEST_F(GrpcPsClientTest, BnStreamRefusedByServerIsNotRetried) {
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kRefuse);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward(layer, 0, MakeMoments(2, {1}, {1}));
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kPermissionDenied)
      << fwd.status();
  EXPECT_EQ(fakes_[0]->bn_streams(), 1);
}

TEST_F(GrpcPsClientTest, SpinningBnCallersGetTheirOwnResponses) {
  // Callers that poll before they block (bn_spin) still hand each answer to
  // its own caller, whoever holds the poller token.
  fakes_[0]->set_bn_mode(BnMode::kReverseBatches, 3);
  GrpcClientOptions options = Options();
  options.bn_spin = absl::Microseconds(200);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  constexpr int kThreads = 3;
  constexpr int kRounds = 20;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string layer = KeyOnShard(0, "bn", t);
      for (int round = 0; round < kRounds; ++round) {
        const double mark = t * 1000 + round;
        absl::StatusOr<BnForwardResult> fwd = client->BnForward(
            layer, round, MakeMoments(t + 1, {mark}, {1.0}));
        if (!fwd.ok() || fwd->merged.mean != std::vector<double>{mark + 1}) {
          ADD_FAILURE() << "thread " << t << " round " << round << ": "
                        << (fwd.ok() ? "wrong response"
                                     : fwd.status().ToString());
          ++failures;
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(fakes_[0]->bn_requests().size(), 1u * kThreads * kRounds);
}

TEST_F(GrpcPsClientTest, BnSpinLongerThanTheDeadlineStillTimesOut) {
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kHold);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(100);
  options.bn_spin = absl::Seconds(1);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward(layer, 0, MakeMoments(2, {1}, {1}));
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kDeadlineExceeded)
      << fwd.status();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));  // under the spin
}

TEST_F(GrpcPsClientTest, BnCallTimesOutWhenNoResponseComes) {
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kHold);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(300);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward(layer, 0, MakeMoments(2, {1}, {1}));
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kDeadlineExceeded)
      << fwd.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(GrpcPsClientTest, BnCallersSharingAStreamEachTimeOutOnTime) {
  // Callers on one stream start 60 ms apart and are never answered. Whichever
  // of them polls the stream, each must give up at its own deadline.
  fakes_[0]->set_bn_mode(BnMode::kHold);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(400);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  constexpr int kThreads = 4;
  std::vector<absl::Status> status(kThreads);
  std::vector<absl::Duration> took(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      absl::SleepFor(absl::Milliseconds(60) * t);
      const absl::Time start = absl::Now();
      status[t] = client
                      ->BnForward(KeyOnShard(0, "bn", t), 0,
                                  MakeMoments(2, {1.0 * t}, {1}))
                      .status();
      took[t] = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(status[t].code(), absl::StatusCode::kDeadlineExceeded)
        << "caller " << t << ": " << status[t];
    EXPECT_GE(took[t], absl::Milliseconds(390)) << "caller " << t;
    EXPECT_LT(took[t], absl::Seconds(3)) << "caller " << t;
  }
  EXPECT_EQ(fakes_[0]->bn_streams(), 1);  // timeouts leave the stream usable
}

TEST_F(GrpcPsClientTest, LateBnResponseOfACallerThatGaveUpIsDropped) {
  // Shard 0 answers pairs of requests, in reverse order: the first call times
  // out; the second releases both answers, its own first. The late answer
  // must not reach anyone else, and the stream stays in use.
  fakes_[0]->set_bn_mode(BnMode::kReverseBatches, 2);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(300);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const std::string layer = KeyOnShard(0, "bn");
  // Expects the answer to this worker's moments {mark}.
  auto forward = [&](double mark) -> absl::Status {
    absl::StatusOr<BnForwardResult> fwd =
        client->BnForward(layer, 0, MakeMoments(1, {mark}, {1}));
    if (!fwd.ok()) return fwd.status();
    if (fwd->merged.mean != std::vector<double>{mark + 1}) {
      return absl::InternalError(
          absl::StrCat("mark ", mark, ": got another call's answer"));
    }
    return absl::OkStatus();
  };
  EXPECT_EQ(forward(1).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(forward(2).ok());
  // Two concurrent callers release each other's answers; either of them may
  // take the late answer of mark 1 from the stream first.
  absl::Status third;
  std::thread other([&] { third = forward(3); });
  const absl::Status fourth = forward(4);
  other.join();
  EXPECT_TRUE(third.ok()) << third;
  EXPECT_TRUE(fourth.ok()) << fourth;
  EXPECT_EQ(fakes_[0]->bn_requests().size(), 4u);
  EXPECT_EQ(fakes_[0]->bn_streams(), 1);
}

TEST_F(GrpcPsClientTest, BnWriteStuckInFlowControlIsCancelled) {
  // The server never reads: a large request cannot be written. The watchdog
  // cancels the stream after the deadline.
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kNoRead);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(500);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const int64_t channels = 400000;  // 6.4 MB of moments
  bn::Moments big = bn::Moments::Empty(channels);
  const absl::Time start = absl::Now();
  absl::StatusOr<BnForwardResult> fwd = client->BnForward(layer, 0, big);
  EXPECT_FALSE(fwd.ok());
  EXPECT_TRUE(fwd.status().code() == absl::StatusCode::kDeadlineExceeded ||
              fwd.status().code() == absl::StatusCode::kUnavailable)
      << fwd.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
}

TEST_F(GrpcPsClientTest, DestroyingAClientWithOpenStreamsIsPrompt) {
  fakes_[1]->set_bn_mode(BnMode::kIgnoreHalfClose);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(
      client->BnForward(KeyOnShard(0, "bn"), 0, MakeMoments(2, {1}, {1})).ok());
  ASSERT_TRUE(
      client->BnForward(KeyOnShard(1, "bn"), 0, MakeMoments(2, {1}, {1})).ok());
  const absl::Time start = absl::Now();
  client.reset();
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Seconds(5));
  // Shard 0 saw a clean close; shard 1 ignored it and was cancelled.
  ASSERT_TRUE(fakes_[0]->AwaitBnStreamEnded());
  ASSERT_TRUE(fakes_[1]->AwaitBnStreamEnded());
  EXPECT_FALSE(fakes_[0]->last_bn_stream_cancelled());
  EXPECT_TRUE(fakes_[1]->last_bn_stream_cancelled());
}

TEST_F(GrpcPsClientTest, DestroyingAClientWithAHeldCallIsPrompt) {
  fakes_[0]->set_bn_mode(BnMode::kHold);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(200);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  EXPECT_FALSE(
      client->BnForward(KeyOnShard(0, "bn"), 0, MakeMoments(2, {1}, {1})).ok());
  const absl::Time start = absl::Now();
  client.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace bnps::client
