// A host's BN aggregator (hostbn/aggregator.h) against the flat path on
// 127.0.0.1: two hosts of two workers each, every worker's request through
// its host's aggregator, give the bits of four workers sent one by one; BN
// groups that span a host's workers get their groups' merges; the
// shard's batch frame refuses what its connection may not send; a worker
// that leaves fails its peers' round at the shard, naming it; the
// aggregator's metrics count what it relays; a worker that stops reading
// its answers holds up none of its peers and is cut off at the timeout.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "bn/moments.h"
#include "gtest/gtest.h"
#include "hostbn/aggregator.h"
#include "hostbn/aggregator_metrics.h"
#include "metrics/registry.h"
#include "proto/bn_frame.h"
#include "proto/bnps.pb.h"
#include "proto/codec.h"
#include "security/worker_token.h"
#include "server/bn_socket_server.h"
#include "server/raw_bn_conn_testing.h"
#include "server/shard.h"
#include "util/eventually.h"

namespace bnps {
namespace {

using server::bn_testing::RawConn;

constexpr char kToken[] = "bnps-test-token-0123456789abcdef";
constexpr int kWorkers = 4;

struct ShardUnderTest {
  explicit ShardUnderTest(bool per_worker_tokens = false,
                          int workers = kWorkers, int bn_group_size = 0) {
    server::ShardOptions o;
    o.num_workers = workers;
    o.bn_group_size = bn_group_size;
    auto s = server::Shard::Create(o);
    EXPECT_TRUE(s.ok()) << s.status();
    shard = *std::move(s);
    for (int w = 0; w < workers; ++w) {
      EXPECT_TRUE(shard->Register(w, /*incarnation=*/100 + w).ok());
    }
    server::BnSocketServer::Options so;
    so.token = kToken;
    so.per_worker_tokens = per_worker_tokens;
    auto srv = server::BnSocketServer::Start(shard.get(), nullptr, nullptr, so);
    EXPECT_TRUE(srv.ok()) << srv.status();
    bn = *std::move(srv);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(bn->port()); }

  std::unique_ptr<server::Shard> shard;
  std::unique_ptr<server::BnSocketServer> bn;
};

// Moments whose merge depends on its order: large means, unequal counts.
bn::Moments MomentsOf(int worker, int64_t step) {
  bn::Moments m;
  m.count = 3 + 2 * worker + step;
  for (int c = 0; c < 5; ++c) {
    m.mean.push_back(1e8 + 0.1 * worker + 1e-3 * c + 0.37 * step);
    m.m2.push_back(1.0 / 3 + worker * 7.1 + c);
  }
  return m;
}

proto::BnRequest Forward(int worker, uint64_t id, int64_t step) {
  const bn::Moments m = MomentsOf(worker, step);
  proto::BnRequest r;
  r.set_id(id);
  r.set_job("bnps");
  r.set_worker(worker);
  r.set_step(step);
  r.set_layer("bn1");
  r.set_phase(proto::BN_FORWARD);
  proto::EncodeMoments(m, r.mutable_moments());
  return r;
}

proto::BnResponse ReceiveAnswer(RawConn& c) {
  proto::BnResponse resp;
  std::optional<std::string> bytes = c.Receive();
  EXPECT_TRUE(bytes.has_value());
  if (bytes) {
    EXPECT_TRUE(resp.ParseFromString(*bytes));
  }
  return resp;
}

// Says `hello` with the handshake, proving `token`.
proto::BnHelloReply SendHello(RawConn& c, const proto::BnHello& hello,
                              const std::string& token) {
  return c.Hello(hello, token);
}

// A worker's hello to its host's aggregator.
proto::BnHelloReply HelloVia(RawConn& c, int worker, const std::string& upstream,
                             const std::string& token = kToken) {
  proto::BnHello hello;
  hello.set_job("bnps");
  hello.set_worker(worker);
  hello.set_upstream(upstream);
  return SendHello(c, hello, token);
}

// The merged moments each worker got for steps 0..2, as raw bytes.
using Answers = std::vector<std::vector<std::string>>;  // [step][worker]

std::string Bits(const proto::BnResponse& r) {
  EXPECT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ(r.contributors(), kWorkers);
  return r.moments().SerializeAsString();
}

Answers RunSteps(std::vector<std::unique_ptr<RawConn>>& conns) {
  Answers out;
  for (int64_t step = 0; step < 3; ++step) {
    // Sent in reverse worker order: arrival order must not matter.
    for (int w = kWorkers - 1; w >= 0; --w) {
      conns[w]->Send(Forward(w, 10 * step + w, step));
    }
    std::vector<std::string> got;
    for (int w = 0; w < kWorkers; ++w) {
      proto::BnResponse r = ReceiveAnswer(*conns[w]);
      EXPECT_EQ(r.id(), static_cast<uint64_t>(10 * step + w));
      got.push_back(Bits(r));
    }
    out.push_back(got);
  }
  return out;
}

TEST(HostBnTest, TwoHostsThroughAggregatorsGiveTheFlatPathsBits) {
  ShardUnderTest flat;
  std::vector<std::unique_ptr<RawConn>> direct;
  for (int w = 0; w < kWorkers; ++w) {
    direct.push_back(std::make_unique<RawConn>(flat.bn->port()));
    ASSERT_EQ(direct.back()->Hello("bnps", w, kToken).code(), 0);
  }
  const Answers want = RunSteps(direct);

  ShardUnderTest shard;
  std::vector<std::unique_ptr<hostbn::Aggregator>> hosts;
  for (int h = 0; h < 2; ++h) {
    hostbn::Aggregator::Options o;
    o.workers = 2;
    o.token = kToken;
    auto a = hostbn::Aggregator::Start(o);
    ASSERT_TRUE(a.ok()) << a.status();
    hosts.push_back(*std::move(a));
  }
  std::vector<std::unique_ptr<RawConn>> via;
  for (int w = 0; w < kWorkers; ++w) {
    via.push_back(std::make_unique<RawConn>(hosts[w / 2]->port()));
    ASSERT_EQ(HelloVia(*via.back(), w, shard.address()).code(), 0);
  }
  const Answers got = RunSteps(via);
  // One connection per host reached the shard.
  EXPECT_EQ(shard.bn->accepted(), 2);
  EXPECT_EQ(got, want);
  // Every worker got the same merge.
  for (const auto& step : got) {
    for (const std::string& bits : step) EXPECT_EQ(bits, step[0]);
  }
}

// BN groups (--bn_group_size=2 of 4 workers) through one aggregator that
// serves all four, so its frames span both groups: the shard answers each
// entry of a frame as its worker's own request, with that worker's group's
// merge, so each worker gets exactly its group's moments merged in worker
// order, whatever the arrival order.
TEST(HostBnTest, GroupsThroughOneAggregatorGetTheirGroupsMerges) {
  constexpr int kGroup = 2;
  ShardUnderTest shard(/*per_worker_tokens=*/false, kWorkers, kGroup);
  hostbn::Aggregator::Options o;
  o.workers = kWorkers;
  o.token = kToken;
  auto a = hostbn::Aggregator::Start(o);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<std::unique_ptr<RawConn>> via;
  for (int w = 0; w < kWorkers; ++w) {
    via.push_back(std::make_unique<RawConn>((*a)->port()));
    ASSERT_EQ(HelloVia(*via.back(), w, shard.address()).code(), 0);
  }
  for (int64_t step = 0; step < 3; ++step) {
    for (int w : {3, 0, 2, 1}) via[w]->Send(Forward(w, 10 * step + w, step));
    std::vector<bn::Moments> got;
    for (int w = 0; w < kWorkers; ++w) {
      proto::BnResponse r = ReceiveAnswer(*via[w]);
      ASSERT_EQ(r.code(), 0) << r.message();
      EXPECT_EQ(r.contributors(), kGroup);
      absl::StatusOr<bn::Moments> m = proto::DecodeMoments(r.moments());
      ASSERT_TRUE(m.ok()) << m.status();
      const int first = w / kGroup * kGroup;
      const bn::Moments a0 = MomentsOf(first, step);
      const bn::Moments a1 = MomentsOf(first + 1, step);
      const bn::Moments want = bn::MergeInOrder({&a0, &a1}, 5);
      EXPECT_EQ(m->count, want.count) << w << " " << step;
      EXPECT_EQ(m->mean, want.mean) << w << " " << step;  // bit for bit
      EXPECT_EQ(m->m2, want.m2) << w << " " << step;
      got.push_back(*std::move(m));
    }
    EXPECT_NE(got[0].mean, got[2].mean);  // the groups' answers differ
  }
  // One connection reached the shard, for all four workers.
  EXPECT_EQ(shard.bn->accepted(), 1);
}

TEST(HostBnTest, AWorkerThatLeavesFailsItsPeersRoundAtTheShardNamingIt) {
  ShardUnderTest shard;
  hostbn::Aggregator::Options o;
  o.workers = 2;
  o.token = kToken;
  auto a = hostbn::Aggregator::Start(o);
  ASSERT_TRUE(a.ok()) << a.status();
  RawConn w0((*a)->port());
  ASSERT_EQ(HelloVia(w0, 0, shard.address()).code(), 0);
  {
    RawConn w1((*a)->port());
    ASSERT_EQ(HelloVia(w1, 1, shard.address()).code(), 0);
    w0.Send(Forward(0, 1, 0));
  }  // worker 1 leaves without its contribution
  // The round leaves without it, and the shard's barrier fails at its
  // deadline naming the workers it lacks, as on the flat path.
  ASSERT_TRUE(util::Eventually([&] { return shard.shard->bn().Contributed(0); }));
  shard.shard->bn().ExpireDeadlines(absl::InfiniteFuture());
  proto::BnResponse r = ReceiveAnswer(w0);
  EXPECT_EQ(r.id(), 1u);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_NE(r.message().find("waiting for workers [1, 2, 3]"),
            std::string::npos)
      << r.message();
}

TEST(HostBnTest, AShardThatGoesAwayFailsTheRequestsWaitingOnItNamingIt) {
  ShardUnderTest shard;
  hostbn::Aggregator::Options o;
  o.token = kToken;
  auto a = hostbn::Aggregator::Start(o);
  ASSERT_TRUE(a.ok()) << a.status();
  RawConn w0((*a)->port());
  ASSERT_EQ(HelloVia(w0, 0, shard.address()).code(), 0);
  w0.Send(Forward(0, 3, 0));  // waits at the shard for workers 1-3
  ASSERT_TRUE(util::Eventually([&] { return shard.shard->bn().Contributed(0); }));
  shard.bn->Stop();
  proto::BnResponse r = ReceiveAnswer(w0);
  EXPECT_EQ(r.id(), 3u);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(r.message().find("shard at " + std::string("127.0.0.1:")),
            std::string::npos)
      << r.message();
  // Then the worker's connection ends: it reconnects, as after any break.
  EXPECT_FALSE(w0.Receive().has_value());
}

TEST(HostBnTest, TheAggregatorChecksWorkersTokens) {
  ShardUnderTest shard(/*per_worker_tokens=*/true);
  hostbn::Aggregator::Options o;
  o.workers = 1;
  o.token = kToken;
  o.per_worker_tokens = true;
  o.num_workers = kWorkers;
  auto a = hostbn::Aggregator::Start(o);
  ASSERT_TRUE(a.ok()) << a.status();
  {
    RawConn c((*a)->port());
    proto::BnHelloReply r =
        HelloVia(c, 1, shard.address(), security::WorkerToken(kToken, 0));
    // Worker 0's token does not prove worker 1's key.
    EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  }
  RawConn c((*a)->port());
  ASSERT_EQ(HelloVia(c, 0, shard.address(), security::WorkerToken(kToken, 0))
                .code(),
            0);
  // Its own token's proof reached the aggregator; the shard, the job
  // token's.
  proto::BnRequest r = Forward(0, 7, 0);
  r.set_phase(proto::BN_RUNNING);
  c.Send(r);
  proto::BnResponse resp = ReceiveAnswer(c);
  EXPECT_EQ(resp.id(), 7u);
  EXPECT_NE(resp.code(), static_cast<int>(absl::StatusCode::kPermissionDenied))
      << resp.message();
  EXPECT_NE(resp.code(), static_cast<int>(absl::StatusCode::kUnauthenticated))
      << resp.message();
}

TEST(HostBnTest, ConnectionsBeforeTheirHelloHoldBoundedThreads) {
  ShardUnderTest shard(/*per_worker_tokens=*/true);
  hostbn::Aggregator::Options o;
  o.workers = 1;
  o.token = kToken;
  o.per_worker_tokens = true;
  o.num_workers = kWorkers;
  o.max_unauthenticated = 2;
  auto a = hostbn::Aggregator::Start(o);
  ASSERT_TRUE(a.ok()) << a.status();
  // Two silent connections take the two places (and threads); a third is
  // closed on arrival, at once, not after the hello timeout.
  auto silent1 = std::make_unique<RawConn>((*a)->port());
  auto silent2 = std::make_unique<RawConn>((*a)->port());
  const absl::Time before = absl::Now();
  {
    RawConn third((*a)->port());
    EXPECT_EQ(third.Receive(), std::nullopt);
  }
  EXPECT_LT(absl::Now() - before, absl::Seconds(2));
  EXPECT_EQ((*a)->refused(), 1);
  // Once they are gone, a worker's hello is served.
  silent1.reset();
  silent2.reset();
  // (The aggregator's threads see them close in a moment: a connection
  // refused before then is counted at once.)
  bool served = false;
  for (int tries = 0; tries < 50 && !served; ++tries) {
    const int64_t refused = (*a)->refused();
    RawConn c((*a)->port());
    absl::SleepFor(absl::Milliseconds(50));
    if ((*a)->refused() != refused) continue;
    served = HelloVia(c, 0, shard.address(), security::WorkerToken(kToken, 0))
                 .code() == 0;
  }
  EXPECT_TRUE(served);
}

// The value of one series in `registry`'s exposition ("name{labels}"), or -1.
double Series(const metrics::Registry& registry, const std::string& series) {
  const std::string text = registry.TextExposition();
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(HostBnTest, TheAggregatorsMetricsCountWhatItRelays) {
  ShardUnderTest shard(/*per_worker_tokens=*/false, /*workers=*/2);
  metrics::Registry registry;
  hostbn::AggregatorMetrics m(&registry);
  hostbn::Aggregator::Options o;
  o.workers = 2;
  o.token = kToken;
  o.metrics = &m;
  auto a = hostbn::Aggregator::Start(o);
  ASSERT_TRUE(a.ok()) << a.status();
  {
    RawConn bad((*a)->port());
    EXPECT_NE(HelloVia(bad, 0, shard.address(), "not-the-token").code(), 0);
  }
  auto frames = [&](const std::string& direction) {
    return Series(registry, "bnps_host_bn_frames_total{direction=\"" +
                                direction + "\"}");
  };
  {
    RawConn w0((*a)->port()), w1((*a)->port());
    ASSERT_EQ(HelloVia(w0, 0, shard.address()).code(), 0);
    ASSERT_EQ(HelloVia(w1, 1, shard.address()).code(), 0);
    EXPECT_EQ(Series(registry, "bnps_host_bn_workers"), 2);
    EXPECT_TRUE(util::Eventually([&] {
      return Series(registry, "bnps_host_bn_shard_connections") == 1;
    }));
    // Three steps' forwards of both workers (the shard's whole job): each
    // crosses to the shard as one frame for the two of them.
    for (int64_t step = 0; step < 3; ++step) {
      w0.Send(Forward(0, 10 * step, step));
      w1.Send(Forward(1, 10 * step + 1, step));
      proto::BnResponse r0 = ReceiveAnswer(w0), r1 = ReceiveAnswer(w1);
      EXPECT_EQ(r0.id(), static_cast<uint64_t>(10 * step));
      EXPECT_EQ(r1.id(), static_cast<uint64_t>(10 * step + 1));
      EXPECT_EQ(r0.code(), 0) << r0.message();
      EXPECT_EQ(r0.contributors(), 2);
    }
    EXPECT_EQ(frames("from_workers"), 6);
    EXPECT_EQ(frames("to_shards"), 3);
    EXPECT_EQ(frames("from_shards"), 3);
    EXPECT_EQ(frames("to_workers"), 6);
  }
  EXPECT_EQ(Series(registry, "bnps_host_bn_hellos_total{result=\"accepted\"}"),
            2);
  EXPECT_EQ(Series(registry, "bnps_host_bn_hellos_total{result=\"refused\"}"),
            1);
  // The workers left; their group's shard connection goes with Stop.
  EXPECT_TRUE(util::Eventually(
      [&] { return Series(registry, "bnps_host_bn_workers") == 0; }));
  (*a)->Stop();
  EXPECT_EQ(Series(registry, "bnps_host_bn_shard_connections"), 0);
  EXPECT_EQ(Series(registry, "bnps_host_bn_shard_breaks_total"), 1);
}

// The shard's side: a hello naming several workers, and batches.
proto::BnHelloReply HelloFor(RawConn& c, const std::vector<int>& workers,
                             const std::string& token) {
  proto::BnHello hello;
  hello.set_job("bnps");
  hello.set_worker(workers[0]);
  for (int w : workers) hello.add_workers(w);
  return SendHello(c, hello, token);
}

TEST(HostBnTest, AShardTakesAHelloOfSeveralWorkersWithTheJobTokenOnly) {
  ShardUnderTest shard(/*per_worker_tokens=*/true);
  {
    RawConn c(shard.bn->port());
    proto::BnHelloReply r =
        HelloFor(c, {0, 1}, security::WorkerToken(kToken, 0));
    EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
    EXPECT_NE(r.message().find("job token"), std::string::npos) << r.message();
  }
  {
    RawConn c(shard.bn->port());
    EXPECT_EQ(HelloFor(c, {0, 9}, kToken).code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument));
  }
  // A batch over it reaches the batch dispatcher, which refuses more
  // entries than workers (its other checks: server/bn_batch_dispatch_test).
  RawConn c(shard.bn->port());
  ASSERT_EQ(HelloFor(c, {0, 1}, kToken).code(), 0);
  proto::BnRequest batch;
  batch.set_id(1);
  for (int w : {0, 1}) *batch.add_batch() = Forward(w, 10 + w, 0);
  proto::BnRequest* other = batch.add_batch();
  *other = Forward(1, 12, 0);
  other->set_phase(proto::BN_RUNNING);
  c.Send(batch);
  proto::BnResponse resp = ReceiveAnswer(c);
  EXPECT_EQ(resp.id(), 1u);
  EXPECT_EQ(resp.code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
      << "three entries on a connection of two workers";
}

// A listener that poses as a shard: it records every byte it gets and
// answers the first frame with a challenge whose proofs are made up.
class FakeShard {
 public:
  FakeShard() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    socklen_t len = sizeof addr;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeShard() {
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // Everything received, once the peer closed (or 10 s passed).
  std::string Received() {
    done_.WaitForNotificationWithTimeout(absl::Seconds(10));
    absl::MutexLock lock(&mu_);
    return received_;
  }

 private:
  void Serve() {
    const int c = accept(fd_, nullptr, nullptr);
    if (c < 0) return done_.Notify();
    const timeval ten{10, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &ten, sizeof ten);
    proto::FrameReader reader;
    bool answered = false;
    char buf[4096];
    for (;;) {
      const ssize_t k = recv(c, buf, sizeof buf, 0);
      if (k <= 0) break;
      {
        absl::MutexLock lock(&mu_);
        received_.append(buf, static_cast<size_t>(k));
      }
      reader.Append(buf, static_cast<size_t>(k));
      absl::StatusOr<std::optional<absl::string_view>> f = reader.Next();
      if (!answered && f.ok() && f->has_value()) {
        answered = true;
        proto::BnHelloReply challenge;
        challenge.set_challenge(true);
        challenge.set_server_nonce(std::string(32, 'n'));
        challenge.set_job_proof(std::string(32, 'p'));
        std::string out;
        EXPECT_TRUE(proto::AppendFrame(challenge, &out).ok());
        send(c, out.data(), out.size(), MSG_NOSIGNAL);
      }
    }
    close(c);
    done_.Notify();
  }

  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  absl::Notification done_;
  absl::Mutex mu_;
  std::string received_ ABSL_GUARDED_BY(mu_);
};

// A worker names a listener of its own as its shard: the aggregator, which
// holds the job token, says its hello there, finds the listener cannot
// prove the job's key, and sends nothing more; no byte it sent holds the
// token. (Before the handshake the hello carried the job token itself.)
TEST(HostBnTest, AFakeShardBehindTheAggregatorLearnsNoSecret) {
  FakeShard fake;
  hostbn::Aggregator::Options o;
  o.workers = 1;
  o.token = kToken;
  o.per_worker_tokens = true;
  o.num_workers = kWorkers;
  auto a = hostbn::Aggregator::Start(o);
  ASSERT_TRUE(a.ok()) << a.status();
  {
    RawConn w((*a)->port());
    ASSERT_EQ(HelloVia(w, 2, fake.address(), security::WorkerToken(kToken, 2))
                  .code(),
              0);
    // Its requests fail: the shard never proved itself.
    w.Send(Forward(2, 1, 0));
    std::optional<std::string> answer = w.Receive();
    if (answer.has_value()) {
      proto::BnResponse r;
      ASSERT_TRUE(r.ParseFromString(*answer));
      EXPECT_NE(r.code(), 0);
      EXPECT_NE(r.message().find("could not prove"), std::string::npos)
          << r.message();
    }
  }
  (*a)->Stop();
  const std::string got = fake.Received();
  EXPECT_FALSE(got.empty());  // the hello reached it
  EXPECT_EQ(got.find(kToken), std::string::npos);
  EXPECT_EQ(got.find(security::WorkerToken(kToken, 2)), std::string::npos);
  // Exactly one frame: the hello, with no proof after it.
  proto::FrameReader reader;
  reader.Append(got.data(), got.size());
  absl::StatusOr<std::optional<absl::string_view>> first = reader.Next();
  ASSERT_TRUE(first.ok() && first->has_value());
  proto::BnHello hello;
  ASSERT_TRUE(hello.ParseFromArray((*first)->data(), (*first)->size()));
  EXPECT_TRUE(hello.token().empty());
  absl::StatusOr<std::optional<absl::string_view>> second = reader.Next();
  EXPECT_TRUE(second.ok() && !second->has_value());
}

// A forward of `channels` channels: its answer is as large (16 bytes a
// channel), so a few fill a socket's buffers.
proto::BnRequest WideForward(int worker, uint64_t id, int64_t step,
                             int channels) {
  bn::Moments m;
  m.count = 2 + worker;
  m.mean.assign(channels, 1.0 + worker);
  m.m2.assign(channels, 0.5);
  proto::BnRequest r = Forward(worker, id, step);
  proto::EncodeMoments(m, r.mutable_moments());
  return r;
}

// A worker that stops reading its answers (its socket's buffers full)
// holds up none of its peers: the aggregator queues what it cannot write
// yet on that connection alone (hostbn/conn.h) and no group lock or shard
// reader waits on its socket. What the design guarantees: the others go on
// at full speed while the slow one's queue is under the cap
// (Aggregator::kMaxQueuedBytes) and its socket took bytes within
// `timeout`; past either it is cut off as a failed write was (hostbn's
// conn_test shows both). Here the timeout is long (30 s), the slow one
// contributes to every barrier (sync policy, 3 workers) and takes none of
// its answers (8 MiB in all, past any socket buffer), and the others' 16
// steps must each answer within RawConn's 10 s: an aggregator that writes
// to the slow socket under the group's lock (or from the shard's reader)
// stalls them all for the full 30 s.
TEST(HostBnTest, AWorkerThatStopsReadingHoldsUpNoneOfItsPeers) {
  constexpr int kHostWorkers = 3;
  constexpr int kChannels = 32 * 1024;  // 512 KiB an answer
  constexpr int kSteps = 16;
  ShardUnderTest shard(/*per_worker_tokens=*/false, kHostWorkers);
  hostbn::Aggregator::Options o;
  o.workers = kHostWorkers;
  o.token = kToken;
  o.timeout = absl::Seconds(30);
  auto a = hostbn::Aggregator::Start(o);
  ASSERT_TRUE(a.ok()) << a.status();
  // Worker 0 (first in each answer's order) with the smallest receive
  // buffer the kernel allows.
  RawConn slow((*a)->port(), /*receive_buffer=*/4096);
  ASSERT_EQ(HelloVia(slow, 0, shard.address()).code(), 0);
  std::vector<std::unique_ptr<RawConn>> others;
  for (int w = 1; w < kHostWorkers; ++w) {
    others.push_back(std::make_unique<RawConn>((*a)->port()));
    ASSERT_EQ(HelloVia(*others.back(), w, shard.address()).code(), 0);
  }
  for (int64_t step = 0; step < kSteps; ++step) {
    slow.Send(WideForward(0, 100 * step, step, kChannels));
    for (int w = 1; w < kHostWorkers; ++w) {
      others[w - 1]->Send(WideForward(w, 100 * step + w, step, kChannels));
    }
    for (int w = 1; w < kHostWorkers; ++w) {
      std::optional<std::string> bytes = others[w - 1]->Receive();
      ASSERT_TRUE(bytes.has_value()) << "worker " << w << ", step " << step;
      proto::BnResponse r;
      ASSERT_TRUE(r.ParseFromString(*bytes));
      EXPECT_EQ(r.id(), static_cast<uint64_t>(100 * step + w));
      ASSERT_EQ(r.code(), 0) << r.message();
      EXPECT_EQ(r.contributors(), kHostWorkers);
    }
  }
}

// A worker that stops reading its answers (above): once it has taken no
// byte for `timeout` while its answers wait, its connection ends (as a
// failed write did). It gets the answers its socket took, then the end, and
// the aggregator counts it gone. (Its peers' next barrier at the shard then
// waits for it or fails naming it, as after any worker that leaves:
// AWorkerThatLeavesFailsItsPeersRoundAtTheShardNamingIt.)
TEST(HostBnTest, AWorkerThatStopsReadingIsCutOffAtTheWriteTimeout) {
  constexpr int kChannels = 32 * 1024;
  // 6 MiB of answers to the slow one, past its socket's buffers (about
  // 3 MiB here), sent well within the timeout.
  constexpr int kSteps = 12;
  ShardUnderTest shard(/*per_worker_tokens=*/false, /*workers=*/2);
  metrics::Registry registry;
  hostbn::AggregatorMetrics m(&registry);
  hostbn::Aggregator::Options o;
  o.workers = 2;
  o.token = kToken;
  o.timeout = absl::Seconds(3);
  o.metrics = &m;
  auto a = hostbn::Aggregator::Start(o);
  ASSERT_TRUE(a.ok()) << a.status();
  RawConn slow((*a)->port(), /*receive_buffer=*/4096);
  ASSERT_EQ(HelloVia(slow, 0, shard.address()).code(), 0);
  RawConn other((*a)->port());
  ASSERT_EQ(HelloVia(other, 1, shard.address()).code(), 0);
  for (int64_t step = 0; step < kSteps; ++step) {
    slow.Send(WideForward(0, 100 * step, step, kChannels));
    other.Send(WideForward(1, 100 * step + 1, step, kChannels));
    proto::BnResponse r = ReceiveAnswer(other);
    ASSERT_EQ(r.code(), 0) << r.message();
    EXPECT_EQ(r.id(), static_cast<uint64_t>(100 * step + 1));
  }
  EXPECT_TRUE(util::Eventually(
      [&] { return Series(registry, "bnps_host_bn_workers") == 1; }));
  int got = 0;
  while (slow.Receive().has_value()) ++got;
  EXPECT_GT(got, 0);
  EXPECT_LT(got, kSteps);  // the rest were dropped with its connection
}

// With its shards configured, the aggregator refuses a hello naming any
// other address: it relays to none a worker chooses.
TEST(HostBnTest, TheAggregatorConnectsToItsOwnShardsOnly) {
  ShardUnderTest shard;
  hostbn::Aggregator::Options o;
  o.workers = 1;
  o.token = kToken;
  o.shards = {shard.address()};
  auto a = hostbn::Aggregator::Start(o);
  ASSERT_TRUE(a.ok()) << a.status();
  {
    RawConn c((*a)->port());
    proto::BnHelloReply r = HelloVia(c, 0, "10.1.2.3:80");
    EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
    EXPECT_NE(r.message().find("not one of this aggregator's shards"),
              std::string::npos)
        << r.message();
  }
  EXPECT_TRUE((*a)->IsOwnShard(shard.address()));
  EXPECT_FALSE((*a)->IsOwnShard("127.0.0.1:1"));
  o.shards = {"127.0.0.1"};  // a host: any of its ports
  auto by_host = hostbn::Aggregator::Start(o);
  ASSERT_TRUE(by_host.ok());
  EXPECT_TRUE((*by_host)->IsOwnShard("127.0.0.1:1"));
  EXPECT_FALSE((*by_host)->IsOwnShard("127.0.0.2:1"));
  RawConn c((*a)->port());
  EXPECT_EQ(HelloVia(c, 0, shard.address()).code(), 0);
}

}  // namespace
}  // namespace bnps
