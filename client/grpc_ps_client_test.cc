// GrpcPsClient against fake shards: connecting, membership, heartbeats,
// clocks, status.

#include "client/grpc_ps_client.h"
#include "client/grpc_ps_client_testing.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <functional>
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
#include "util/eventually.h"

namespace bnps::client {
namespace {

using ::testing::HasSubstr;
using fakes::GrpcPsClientTest;
using fakes::BnMode;
using fakes::FakeShard;
using fakes::kShards;
using fakes::kWorkers;
using fakes::kJob;
using fakes::KeyOnShard;
using fakes::MakeParam;
using fakes::MakeMoments;

TEST(BnSpinTest, MinusOnePollsAMillisecondOnlyWhereCoresSuffice) {
  using O = GrpcClientOptions;
  EXPECT_EQ(*O::BnSpinFromUs(-1, 1), absl::Milliseconds(1));
  EXPECT_EQ(*O::BnSpinFromUs(-1, 1 << 20), absl::ZeroDuration());
  EXPECT_EQ(*O::BnSpinFromUs(0, 1), absl::ZeroDuration());
  EXPECT_EQ(*O::BnSpinFromUs(250, 1 << 20), absl::Microseconds(250));
  EXPECT_EQ(O::BnSpinFromUs(-2, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(O::BnSpinFromUs(1000001, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, ConnectRegistersWithEveryShard) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options(/*worker=*/1));
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->num_shards(), kShards);
  EXPECT_EQ(client->config().policy(), proto::POLICY_SYNC);
  EXPECT_EQ(client->config().num_workers(), kWorkers);
  for (int i = 0; i < kShards; ++i) {
    std::vector<proto::RegisterRequest> regs = fakes_[i]->registrations();
    ASSERT_EQ(regs.size(), 1u) << "shard " << i;
    EXPECT_EQ(regs[0].job(), kJob);
    EXPECT_EQ(regs[0].worker(), 1);
    EXPECT_EQ(regs[0].num_workers(), kWorkers);
    EXPECT_EQ(regs[0].num_shards(), kShards);
    // No GrpcClientOptions::host: the machine's host name.
    char host[256] = {};
    ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
    EXPECT_EQ(regs[0].host(), host);
  }
}

// GrpcClientOptions::host (bnps_worker --bn_host) is the host it registers
// from (servers that group BN by host group by it).
TEST_F(GrpcPsClientTest, ConnectRegistersTheHostItIsGiven) {
  GrpcClientOptions options = Options(/*worker=*/0);
  options.host = "node-3";
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < kShards; ++i) {
    std::vector<proto::RegisterRequest> regs = fakes_[i]->registrations();
    ASSERT_EQ(regs.size(), 1u) << "shard " << i;
    EXPECT_EQ(regs[0].host(), "node-3");
  }
}

TEST_F(GrpcPsClientTest, ConnectRejectsBadOptions) {
  GrpcClientOptions options = Options();
  options.servers.clear();
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.worker = kWorkers;
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.worker = -1;
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.job.clear();
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.max_attempts = 0;
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.rpc_timeout = absl::ZeroDuration();
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.push_part_bytes = -1;
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.bn_spin = absl::Microseconds(-1);
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const char* bad : {"127.0.0.1", ":7200", "h:0", "h:70000", "h:x"}) {
    options = Options();
    options.bn_host_aggregator = bad;
    const absl::Status s = GrpcPsClient::Connect(options).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("bn_host_aggregator")) << bad;
  }
}

TEST_F(GrpcPsClientTest, ConnectRejectsWorkerCountMismatch) {
  fakes_[1]->mutable_config()->set_num_workers(3);
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Connect(Options());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(client.status().message(), HasSubstr("shard 1"));
}

// A refused Connect registers nowhere: checking happens before joining.
void ExpectNoRegistrations(
    const std::vector<std::unique_ptr<FakeShard>>& fakes) {
  for (size_t i = 0; i < fakes.size(); ++i) {
    EXPECT_TRUE(fakes[i]->registrations().empty()) << "shard " << i;
  }
}

TEST_F(GrpcPsClientTest, ConnectRejectsServersOutOfOrder) {
  GrpcClientOptions options = Options();
  std::swap(options.servers[0], options.servers[1]);
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client = GrpcPsClient::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(client.status().message(), HasSubstr("shard order"));
  ExpectNoRegistrations(fakes_);
}

TEST_F(GrpcPsClientTest, ConnectRejectsShardsThatDisagree) {
  fakes_[1]->mutable_config()->set_policy(proto::POLICY_ASYNC);
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Connect(Options());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(client.status().message(), HasSubstr("policy"));
  ExpectNoRegistrations(fakes_);
}

TEST_F(GrpcPsClientTest, CheckConfigRunsBeforeRegistering) {
  GrpcClientOptions options = Options();
  std::vector<proto::JobConfig> seen;
  options.check_config = [&](const proto::JobConfig& c) {
    seen.push_back(c);
    return c.policy() == proto::POLICY_ASYNC
               ? absl::OkStatus()
               : absl::FailedPreconditionError("launched for async");
  };
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Connect(options);
  EXPECT_EQ(client.status(),
            absl::FailedPreconditionError("launched for async"));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].policy(), proto::POLICY_SYNC);
  ExpectNoRegistrations(fakes_);
  for (auto& fake : fakes_) {
    fake->mutable_config()->set_policy(proto::POLICY_ASYNC);
  }
  client = GrpcPsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(fakes_[0]->registrations().size(), 1u);
  EXPECT_EQ(fakes_[1]->registrations().size(), 1u);
}

TEST_F(GrpcPsClientTest, EachClientIsAnIncarnationOfItsOwn) {
  GrpcClientOptions options = Options();
  options.heartbeat_interval = absl::Milliseconds(20);
  std::unique_ptr<GrpcPsClient> first = Connect(options);
  ASSERT_NE(first, nullptr);
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while ((fakes_[0]->heartbeats() == 0 || fakes_[1]->heartbeats() == 0) &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  first.reset();
  std::unique_ptr<GrpcPsClient> second = Connect(options);
  ASSERT_NE(second, nullptr);
  const std::vector<proto::RegisterRequest> regs = fakes_[0]->registrations();
  ASSERT_EQ(regs.size(), 2u);
  EXPECT_NE(regs[0].incarnation(), 0u);
  EXPECT_NE(regs[1].incarnation(), 0u);
  EXPECT_NE(regs[0].incarnation(), regs[1].incarnation());
  // One process uses one incarnation with every shard and in its heartbeats.
  EXPECT_EQ(fakes_[1]->registrations()[0].incarnation(), regs[0].incarnation());
  EXPECT_EQ(fakes_[0]->heartbeat_incarnations().count(regs[0].incarnation()),
            1u);
  EXPECT_EQ(fakes_[1]->heartbeat_incarnations().count(regs[0].incarnation()),
            1u);
}

TEST_F(GrpcPsClientTest, ADroppedWorkerStopsAtOnce) {
  GrpcClientOptions options = Options();
  options.heartbeat_interval = absl::Milliseconds(20);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::map<std::string, Param> grads = {
      {KeyOnShard(1, "w"), MakeParam({2}, 1)}};
  ASSERT_TRUE(client->PushGradients(0, 1, grads).ok());
  fakes_[1]->set_heartbeat_status(grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      "worker 1 was lost (no heartbeat for 10s): the job dropped it"));
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (client->heartbeat_stats().dropped.ok() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Status dropped = client->heartbeat_stats().dropped;
  EXPECT_EQ(dropped.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(dropped.message(), HasSubstr("was lost"));
  EXPECT_THAT(dropped.message(), HasSubstr("shard 1"));
  // Nothing more reaches the servers: the process is to stop.
  EXPECT_EQ(client->PushGradients(1, 1, grads), dropped);
  std::unique_ptr<GradientPush> push = client->StartPush(1, 1);
  push->Add(std::make_shared<const Params>(grads));
  EXPECT_EQ(push->Finish(), dropped);
  EXPECT_EQ(client->PullParameters(0).status(), dropped);
  EXPECT_EQ(client->FinishStep(1), dropped);
  EXPECT_EQ(client->BnForward(KeyOnShard(0, "bn"), 1, MakeMoments(2, {1}, {1}))
                .status(),
            dropped);
  EXPECT_EQ(fakes_[1]->pushes().size(), 1u);
  EXPECT_TRUE(fakes_[0]->finished_clocks().empty());
}

TEST_F(GrpcPsClientTest, ADroppedWorkersBnCallUnderWayEndsWithWhy) {
  // Shard 0 never answers (a shard this process cannot reach); shard 1
  // drops the worker. The call waiting on shard 0 ends with the drop, not
  // at its deadline.
  fakes_[0]->set_bn_mode(BnMode::kHold);
  GrpcClientOptions options = Options();
  options.heartbeat_interval = absl::Milliseconds(20);
  options.rpc_timeout = absl::Seconds(20);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<BnForwardResult> fwd;
  std::thread call([&] {
    fwd = client->BnForward(KeyOnShard(0, "bn"), 0, MakeMoments(2, {1}, {1}));
  });
  EXPECT_TRUE(util::Eventually(
      [&] { return fakes_[0]->bn_requests().size() == 1; }));
  fakes_[1]->set_heartbeat_status(grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      "worker 1 was lost (no heartbeat for 10s): the job dropped it"));
  call.join();
  const absl::Status dropped = client->heartbeat_stats().dropped;
  EXPECT_EQ(dropped.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fwd.status(), dropped);
  // And so does every later BN call.
  EXPECT_EQ(client->BnBackward(KeyOnShard(1, "bn"), 0,
                               bn::BackwardSums{{1.0}, {1.0}})
                .status(),
            dropped);
}

TEST_F(GrpcPsClientTest, ADroppedWorkersPushesAndPullsUnderWayEndWithWhy) {
  // Shard 0 holds pushes and pulls (a shard this process cannot reach, or
  // a barrier that will not fill); shard 1 drops the worker. The calls
  // waiting on shard 0 end with the drop, not at their deadlines.
  fakes_[0]->set_hold_pushes(true);
  fakes_[0]->set_hold_pulls(true);
  fakes_[0]->SetParam(KeyOnShard(0, "w"), MakeParam({2}, 1));
  GrpcClientOptions options = Options();
  options.heartbeat_interval = absl::Milliseconds(20);
  options.rpc_timeout = absl::Seconds(20);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const std::map<std::string, Param> grads = {
      {KeyOnShard(0, "w"), MakeParam({2}, 1)}};
  absl::Status pushed, pulled, streamed;
  const absl::Time start = absl::Now();
  std::thread push([&] { pushed = client->PushGradients(0, 1, grads); });
  std::thread pull([&] {
    pulled = client->PullParameters({KeyOnShard(0, "w")}, 0).status();
  });
  Params into = {{KeyOnShard(0, "w"), Param{}}};
  std::unique_ptr<ParameterPull> streaming =
      client->StartPull(0, {KeyOnShard(0, "w")}, &into);
  EXPECT_TRUE(util::Eventually([&] {
    return fakes_[0]->held_pushes() == 1 &&
           fakes_[0]->pull_requests().size() == 2;
  }));
  fakes_[1]->set_heartbeat_status(grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      "worker 1 was lost (no heartbeat for 10s): the job dropped it"));
  push.join();
  pull.join();
  streamed = streaming->Finish();
  const absl::Duration took = absl::Now() - start;
  const absl::Status dropped = client->heartbeat_stats().dropped;
  ASSERT_EQ(dropped.code(), absl::StatusCode::kFailedPrecondition);
  for (const absl::Status& s : {pushed, pulled, streamed}) {
    EXPECT_EQ(s.code(), dropped.code()) << s;
    EXPECT_THAT(s.message(), HasSubstr(dropped.message()));
  }
  EXPECT_THAT(pushed.message(), HasSubstr("PushGradients of step 0"));
  EXPECT_LT(took, absl::Seconds(10));
  // A later call ends at once too, without reaching the shard.
  EXPECT_EQ(client->StartStep(1).status(), dropped);
  fakes_[0]->set_hold_pushes(false);
  fakes_[0]->set_hold_pulls(false);
}

TEST_F(GrpcPsClientTest, OnBnCallSeesEveryBnCallWithItsLayerAndPass) {
  GrpcClientOptions options = Options();
  absl::Mutex mu;
  std::vector<std::pair<std::string, bool>> seen;
  options.on_bn_call = [&](const std::string& layer, bool backward,
                           absl::Duration took) {
    EXPECT_GE(took, absl::ZeroDuration());
    absl::MutexLock lock(&mu);
    seen.emplace_back(layer, backward);
  };
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const std::string layer = KeyOnShard(1, "bn");
  ASSERT_TRUE(client->BnForward(layer, 0, MakeMoments(2, {1}, {1})).ok());
  ASSERT_TRUE(
      client->BnBackward(layer, 0, bn::BackwardSums{{1.0}, {1.0}}).ok());
  // A failed call is not observed.
  EXPECT_FALSE(client->BnForward("", 1, MakeMoments(2, {1}, {1})).ok());
  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, bool>>{
                      {layer, false}, {layer, true}}));
}

TEST_F(GrpcPsClientTest, ConnectRejectsMissingShardCount) {
  GrpcClientOptions options = Options();
  options.servers.pop_back();  // the servers run a 2-shard job
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client = GrpcPsClient::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(GrpcPsClientTest, ConnectToDeadPortFailsWithinConnectTimeout) {
  // A bound socket that does not listen: connections are refused, and nobody
  // else can take the port meanwhile.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  GrpcClientOptions options = Options();
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  options.servers = {address};
  // Connect gives up after connect_timeout, however long calls may take.
  options.connect_timeout = absl::Milliseconds(500);
  options.rpc_timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client = GrpcPsClient::Connect(options);
  const absl::Duration took = absl::Now() - start;
  close(fd);
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(client.status().code() == absl::StatusCode::kUnavailable ||
              client.status().code() == absl::StatusCode::kDeadlineExceeded)
      << client.status();
  EXPECT_THAT(client.status().message(), HasSubstr(address));
  EXPECT_THAT(client.status().message(), HasSubstr("connect_timeout"));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST_F(GrpcPsClientTest, ConnectRetriesUntilAShardComesUp) {
  // Shard 1's address refuses connections for a while (a server still
  // starting); Connect keeps trying with backoff and succeeds once it
  // listens.
  const std::string late = addresses_[1];
  servers_[1]->Shutdown(absl::ToChronoTime(absl::Now()));
  servers_[1]->Wait();
  std::unique_ptr<grpc::Server> restarted;
  std::thread restart([this, late, &restarted] {
    absl::SleepFor(absl::Milliseconds(700));
    grpc::ServerBuilder builder;
    builder.AddListeningPort(late, grpc::InsecureServerCredentials());
    builder.RegisterService(fakes_[1].get());
    restarted = builder.BuildAndStart();
  });
  GrpcClientOptions options = Options();
  options.connect_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Connect(options);
  restart.join();
  ASSERT_NE(restarted, nullptr) << "could not listen on " << late << " again";
  servers_[1] = std::move(restarted);
  EXPECT_TRUE(client.ok()) << client.status();
}

TEST_F(GrpcPsClientTest, ConnectRejectsBadConnectTimeout) {
  GrpcClientOptions options = Options();
  options.connect_timeout = absl::ZeroDuration();
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.connect_timeout = absl::InfiniteDuration();
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, HeartbeatsReachEveryShard) {
  GrpcClientOptions options = Options();
  options.heartbeat_interval = absl::Milliseconds(30);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while ((fakes_[0]->heartbeats() < 3 || fakes_[1]->heartbeats() < 3) &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(fakes_[0]->heartbeats(), 3);
  EXPECT_GE(fakes_[1]->heartbeats(), 3);
  HeartbeatStats stats = client->heartbeat_stats();
  EXPECT_EQ(stats.failed, 0);
  EXPECT_EQ(stats.live_workers, (std::vector<int>{0, 1}));
}

// Shards do not talk to each other: a loss one shard's heartbeat answer
// lists goes to the others in this worker's next heartbeats, until each
// lists it too; news no shard lists any more is forgotten.
TEST_F(GrpcPsClientTest, HeartbeatsCarryOneShardsLossesToTheOthers) {
  GrpcClientOptions options = Options();
  options.heartbeat_interval = absl::Milliseconds(20);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  proto::WorkerLoss loss;
  loss.set_worker(1);
  loss.set_incarnation(77);
  loss.set_shard(0);
  loss.set_reason("worker 1 was lost (no heartbeat for 3s)");
  // Waits until `done` holds (5 s at most).
  auto until = [](const std::function<bool()>& done) {
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (!done() && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return done();
  };
  fakes_[0]->set_heartbeat_lost({loss});
  ASSERT_TRUE(until([&] { return fakes_[1]->heartbeats_with_losses() > 0; }));
  std::vector<proto::WorkerLoss> got = fakes_[1]->last_heartbeat_losses();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].SerializeAsString(), loss.SerializeAsString());
  EXPECT_EQ(fakes_[0]->heartbeats_with_losses(), 0);  // not back to its source
  // Once shard 1 lists it, it is told no more.
  fakes_[1]->set_heartbeat_lost({loss});
  int beats = fakes_[1]->heartbeats();
  ASSERT_TRUE(until([&] { return fakes_[1]->heartbeats() >= beats + 2; }));
  int carried = fakes_[1]->heartbeats_with_losses();
  beats = fakes_[1]->heartbeats();
  ASSERT_TRUE(until([&] { return fakes_[1]->heartbeats() >= beats + 3; }));
  EXPECT_EQ(fakes_[1]->heartbeats_with_losses(), carried);
  EXPECT_GE(client->heartbeat_stats().losses_relayed, 1);
  // Neither lists it (the worker registered again): stale, forgotten.
  fakes_[0]->set_heartbeat_lost({});
  fakes_[1]->set_heartbeat_lost({});
  beats = fakes_[1]->heartbeats();
  ASSERT_TRUE(until([&] { return fakes_[1]->heartbeats() >= beats + 2; }));
  carried = fakes_[1]->heartbeats_with_losses();
  beats = fakes_[1]->heartbeats();
  ASSERT_TRUE(until([&] { return fakes_[1]->heartbeats() >= beats + 3; }));
  EXPECT_EQ(fakes_[1]->heartbeats_with_losses(), carried);
  EXPECT_TRUE(client->heartbeat_stats().failed == 0);
}

TEST_F(GrpcPsClientTest, HeartbeatIntervalMustBeShorterThanServerTimeout) {
  GrpcClientOptions options = Options();
  options.heartbeat_interval = absl::Seconds(20);  // servers time out at 10 s
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(GrpcPsClientTest, ClocksGoToShardZero) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->StartStep(0).ok());
  ASSERT_TRUE(client->FinishStep(1).ok());
  ASSERT_TRUE(client->StartStep(1).ok());
  EXPECT_EQ(fakes_[0]->started_steps(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(fakes_[0]->finished_clocks(), (std::vector<int64_t>{1}));
  EXPECT_TRUE(fakes_[1]->started_steps().empty());
  EXPECT_EQ(client->StartStep(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, GetStatusAsksTheNamedShard) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<proto::StatusResponse> status = client->GetStatus(1);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->config().shard(), 1);
  EXPECT_EQ(client->GetStatus(2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bnps::client
