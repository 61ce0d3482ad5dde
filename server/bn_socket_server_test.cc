// The raw-TCP BN listener, spoken to byte by byte as any client would: the
// hello and its refusals, a sync barrier of two connections, and bytes that
// are not ours.

#include "server/bn_socket_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/bn_frame.h"
#include "proto/bnps.pb.h"
#include "proto/codec.h"
#include "server/raw_bn_conn_testing.h"
#include "security/job_token.h"

namespace bnps::server {
namespace {

using bn_testing::Forward;
using bn_testing::RawConn;

constexpr char kToken[] = "bnps-test-token-0123456789abcdef";

class BnSocketServerTest : public ::testing::Test {
 protected:
  void Start(int workers, BnSocketServer::Options so = {},
             const std::string& token = kToken) {
    ShardOptions o;
    o.num_workers = workers;
    absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(o);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = *std::move(shard);
    // BN calls come from registered workers only.
    for (int w = 0; w < workers; ++w) {
      ASSERT_TRUE(shard_->Register(w, /*incarnation=*/100 + w).ok());
    }
    so.token = token;
    absl::StatusOr<std::unique_ptr<BnSocketServer>> server =
        BnSocketServer::Start(shard_.get(), nullptr, nullptr, so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<Shard> shard_;
  std::unique_ptr<BnSocketServer> server_;
};

TEST_F(BnSocketServerTest, AWrongTokenOrJobIsAnsweredThenTheConnectionEnds) {
  ASSERT_NO_FATAL_FAILURE(Start(1));
  {
    RawConn c(server_->port());
    proto::BnHelloReply r = c.Hello("bnps", 0, "not-the-token-0123456789abcdefgh");
    EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
    EXPECT_EQ(c.Receive(), std::nullopt);
  }
  {
    RawConn c(server_->port());
    proto::BnHelloReply r = c.Hello("another-job", 0, kToken);
    EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(r.message().find("another-job"), std::string::npos);
    EXPECT_EQ(c.Receive(), std::nullopt);
  }
  {
    RawConn c(server_->port());
    proto::BnHelloReply r = c.Hello("bnps", 5, kToken);  // outside [0, 1)
    EXPECT_NE(r.code(), 0);
    EXPECT_EQ(c.Receive(), std::nullopt);
  }
  EXPECT_EQ(server_->accepted(), 3);
}

// A client that loops on a refused hello cannot flood the log: a burst of
// 100 lines, then five a second, and the next says how many were left out.
TEST_F(BnSocketServerTest, RefusalsAreLoggedAtABoundedRate) {
  ASSERT_NO_FATAL_FAILURE(Start(1));
  testing::internal::CaptureStderr();
  const absl::Time start = absl::Now();
  for (int i = 0; i < 300; ++i) {
    RawConn c(server_->port());
    EXPECT_EQ(c.Hello("bnps", 0, "not-the-token-0123456789").code(),
              static_cast<int>(absl::StatusCode::kUnauthenticated));
  }
  const absl::Duration took = absl::Now() - start;
  const std::string log = testing::internal::GetCapturedStderr();
  int lines = 0;
  for (size_t at = log.find("rejected"); at != std::string::npos;
       at = log.find("rejected", at + 1)) {
    ++lines;
  }
  EXPECT_LE(lines, 100 + 5 * (1 + absl::ToInt64Seconds(took))) << log;
  EXPECT_LT(lines, 300);
}

TEST_F(BnSocketServerTest, TwoConnectionsMeetAtTheBarrier) {
  ASSERT_NO_FATAL_FAILURE(Start(2));
  RawConn a(server_->port()), b(server_->port());
  ASSERT_EQ(a.Hello("bnps", 0, kToken).code(), 0);
  ASSERT_EQ(b.Hello("bnps", 1, kToken).code(), 0);
  // Worker 1's barrier partner has not come: nothing for `a` yet; then `b`
  // completes it and both get the merge of both.
  const auto [ra, rb] = bn_testing::MeetAtTheBarrier(a, b, 7, 9);
  EXPECT_EQ(ra.id(), 7u);
  EXPECT_EQ(rb.id(), 9u);
  EXPECT_EQ(ra.code(), 0) << ra.message();
  EXPECT_EQ(ra.contributors(), 2);
  absl::StatusOr<bn::Moments> ma = proto::DecodeMoments(ra.moments(), 2);
  absl::StatusOr<bn::Moments> mb = proto::DecodeMoments(rb.moments(), 2);
  ASSERT_TRUE(ma.ok() && mb.ok());
  EXPECT_EQ(ma->count, 8);
  EXPECT_EQ(ma->mean, (std::vector<double>{2.0, 3.0}));
  EXPECT_EQ(ma->mean, mb->mean);
  EXPECT_EQ(ma->m2, mb->m2);

  // The same request again is answered from the barrier's record, not
  // merged twice (exactly once, as on the stream).
  a.Send(Forward(0, 8, {1.0, 2.0}));
  std::optional<std::string> again = a.Receive();
  ASSERT_TRUE(again);
  proto::BnResponse r2;
  ASSERT_TRUE(r2.ParseFromString(*again));
  EXPECT_EQ(r2.id(), 8u);
  EXPECT_EQ(r2.code(), 0) << r2.message();
  absl::StatusOr<bn::Moments> m2 = proto::DecodeMoments(r2.moments(), 2);
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->mean, ma->mean);
}

// The process's CPU time over `wall` of this thread sleeping: what the
// listener's thread used meanwhile.
absl::Duration CpuWhileSleeping(absl::Duration wall) {
  auto cpu = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return absl::DurationFromTimespec(ts);
  };
  const absl::Duration before = cpu();
  absl::SleepFor(wall);
  return cpu() - before;
}

TEST_F(BnSocketServerTest, BusyPollRunsForItsHoldAfterAMessageThenSleeps) {
  BnSocketServer::Options so;
  so.busy_poll = absl::Milliseconds(400);
  ASSERT_NO_FATAL_FAILURE(Start(1, so));
  const absl::Duration wall = absl::Milliseconds(150);
  // No traffic yet: the listener sleeps.
  EXPECT_LT(CpuWhileSleeping(wall), wall / 5);
  RawConn c(server_->port());
  ASSERT_EQ(c.Hello("bnps", 0, kToken).code(), 0);
  c.Send(Forward(0, 3, {1.0, 2.0}));
  std::optional<std::string> got = c.Receive();
  ASSERT_TRUE(got);
  proto::BnResponse r;
  ASSERT_TRUE(r.ParseFromString(*got));
  EXPECT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ(r.id(), 3u);
  // Within the hold it polls (a core's worth when nothing else wants the
  // CPU; a share of one on a loaded machine).
  EXPECT_GT(CpuWhileSleeping(wall), wall / 5);
  // After it, sleeps again.
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_LT(CpuWhileSleeping(wall), wall / 5);
}

TEST_F(BnSocketServerTest, BytesThatAreNotOursEndTheConnection) {
  ASSERT_NO_FATAL_FAILURE(Start(1));
  {
    RawConn c(server_->port());
    c.SendBytes(std::string("\xff\xff\xff\xff", 4));  // a 4 GiB frame
    EXPECT_EQ(c.Receive(), std::nullopt);
  }
  {
    RawConn c(server_->port());
    ASSERT_EQ(c.Hello("bnps", 0, kToken).code(), 0);
    std::string junk(4, '\0');
    junk[0] = 3;
    junk += "\xff\xff\xff";  // a 3-byte frame that is no BnRequest
    c.SendBytes(junk);
    EXPECT_EQ(c.Receive(), std::nullopt);
  }
  // The server still serves.
  RawConn c(server_->port());
  ASSERT_EQ(c.Hello("bnps", 0, kToken).code(), 0);
  c.Send(Forward(0, 1, {5.0}));
  std::optional<std::string> got = c.Receive();
  ASSERT_TRUE(got);
  proto::BnResponse r;
  ASSERT_TRUE(r.ParseFromString(*got));
  EXPECT_EQ(r.code(), 0) << r.message();
}

TEST_F(BnSocketServerTest, BeforeItsHelloAConnectionIsHeldShort) {
  BnSocketServer::Options so;
  so.hello_timeout = absl::Milliseconds(100);
  so.max_connections = 2;
  ASSERT_NO_FATAL_FAILURE(Start(1, so));
  {
    // A first frame longer than any hello.
    RawConn c(server_->port());
    std::string frame(4, '\0');
    frame[1] = 0x20;  // 8 KiB
    frame += std::string(8192, 'x');
    c.SendBytes(frame);
    EXPECT_EQ(c.Receive(), std::nullopt);
  }
  {
    // Silent past the hello timeout.
    RawConn c(server_->port());
    EXPECT_EQ(c.Receive(), std::nullopt);
  }
  // At most two open: a third is closed on arrival.
  RawConn a(server_->port()), b(server_->port());
  ASSERT_EQ(a.Hello("bnps", 0, kToken).code(), 0);
  ASSERT_EQ(b.Hello("bnps", 0, kToken).code(), 0);
  RawConn third(server_->port());
  EXPECT_EQ(third.Receive(), std::nullopt);
}

TEST_F(BnSocketServerTest, AClientThatDoesNotReadIsCutOff) {
  BnSocketServer::Options so;
  so.max_queued_bytes = 256 << 10;
  ASSERT_NO_FATAL_FAILURE(Start(1, so));
  RawConn c(server_->port(), /*receive_buffer=*/4096);
  ASSERT_EQ(c.Hello("bnps", 0, kToken).code(), 0);
  // Answers of 160 KB each, never read: the socket's buffers fill, then the
  // server's queue passes its cap and the connection is cut. Sending stops
  // at the first failure (the server closed).
  const std::vector<double> wide(10000, 1.0);
  std::string bytes;
  for (int step = 0; step < 64; ++step) {
    proto::BnRequest r = Forward(0, step + 1, wide);
    r.set_step(step);
    ASSERT_TRUE(proto::AppendFrame(r, &bytes).ok());
  }
  c.SendAllowingFailure(bytes);
  // Whatever answers came before the cut, the connection then ends.
  int answers = 0;
  while (c.Receive().has_value()) ++answers;
  EXPECT_LT(answers, 64);
}

TEST_F(BnSocketServerTest, StopEndsEveryConnection) {
  ASSERT_NO_FATAL_FAILURE(Start(2));
  RawConn a(server_->port());
  ASSERT_EQ(a.Hello("bnps", 0, kToken).code(), 0);
  a.Send(Forward(0, 1, {1.0}));  // waits for worker 1, who never comes
  server_->Stop();
  EXPECT_EQ(a.Receive(), std::nullopt);
  server_->Stop();  // idempotent
}

proto::BnResponse ParseResponse(const std::optional<std::string>& bytes) {
  proto::BnResponse r;
  EXPECT_TRUE(bytes.has_value());
  if (bytes) {
    EXPECT_TRUE(r.ParseFromString(*bytes));
  }
  return r;
}

// Slow readers are bounded by the server's budget, not only
// each by its own cap: past it, they are cut off, and what the server holds
// never exceeds the budget.
TEST_F(BnSocketServerTest, SlowReadersAreCutOffWithinTheServerBudget) {
  BnSocketServer::Options so;
  so.memory_budget_bytes = 1 << 20;  // far below 4 x the 64 MiB per-conn cap
  ASSERT_NO_FATAL_FAILURE(Start(1, so));
  const std::vector<double> wide(10000, 1.0);  // 160 KB answers
  std::vector<std::unique_ptr<RawConn>> readers;
  for (int c = 0; c < 4; ++c) {
    readers.push_back(std::make_unique<RawConn>(server_->port(), 4096));
    ASSERT_EQ(readers.back()->Hello("bnps", 0, kToken).code(), 0);
  }
  // All send the same steps: after the first, answers come from the
  // barrier's record (the same size).
  std::string bytes;
  for (int step = 0; step < 40; ++step) {
    proto::BnRequest r = Forward(0, step + 1, wide);
    r.set_step(step);
    ASSERT_TRUE(proto::AppendFrame(r, &bytes).ok());
  }
  int64_t peak = 0;
  for (auto& r : readers) {
    r->SendAllowingFailure(bytes);
    peak = std::max(peak, server_->memory()->used());
  }
  // No reader gets all its answers: it is cut off (the connection ends
  // after what the socket took), or, the budget spent, its requests are
  // refused.
  for (auto& r : readers) {
    int merged = 0;
    for (std::optional<std::string> a = r->Receive(); a.has_value();
         a = r->Receive()) {
      proto::BnResponse resp;
      ASSERT_TRUE(resp.ParseFromString(*a));
      // Refused: RESOURCE_EXHAUSTED, and the steps after a refused one
      // FAILED_PRECONDITION (from the future).
      if (resp.code() == 0) ++merged;
      peak = std::max(peak, server_->memory()->used());
      if (resp.id() == 40) break;  // the last answer: not cut off
    }
    EXPECT_LT(merged, 40);
  }
  EXPECT_LE(peak, so.memory_budget_bytes);
  EXPECT_EQ(server_->memory()->limit(), so.memory_budget_bytes);
}

// Frames begun and never finished are held within the budget (those
// past it are shed) and closed at the frame timeout.
TEST_F(BnSocketServerTest, PartialFramesAreShedAndTimedOut) {
  BnSocketServer::Options so;
  so.memory_budget_bytes = 256 << 10;
  so.frame_timeout = absl::Milliseconds(300);
  ASSERT_NO_FATAL_FAILURE(Start(1, so));
  std::vector<std::unique_ptr<RawConn>> senders;
  for (int c = 0; c < 8; ++c) {
    senders.push_back(std::make_unique<RawConn>(server_->port()));
    ASSERT_EQ(senders.back()->Hello("bnps", 0, kToken).code(), 0);
    // A 100 KiB frame of which 60 KiB arrive.
    std::string partial(4, '\0');
    partial[2] = 0x01;
    partial[1] = static_cast<char>(0x90);  // 0x019000 = 100 KiB + ...
    partial += std::string(60 << 10, 'x');
    senders.back()->SendAllowingFailure(partial);
  }
  int64_t peak = 0;
  const absl::Time until = absl::Now() + absl::Milliseconds(200);
  while (absl::Now() < until) {
    peak = std::max(peak, server_->memory()->used());
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_LE(peak, so.memory_budget_bytes);
  EXPECT_GT(peak, 0);
  // All end: shed at once, or closed at the frame timeout.
  for (auto& c : senders) EXPECT_EQ(c->Receive(), std::nullopt);
  EXPECT_EQ(server_->memory()->used(), 0);
  // The server serves on.
  RawConn c(server_->port());
  ASSERT_EQ(c.Hello("bnps", 0, kToken).code(), 0);
  c.Send(Forward(0, 1, {5.0}));
  EXPECT_EQ(ParseResponse(c.Receive()).code(), 0);
}

// An answer that cannot be framed, or that the connection could
// not hold, is refused before the work with an error the worker reads; the
// connection stays.
TEST_F(BnSocketServerTest, AnAnswerTooLargeIsAnErrorNotAClose) {
  BnSocketServer::Options so;
  so.max_queued_bytes = 200 << 10;
  ASSERT_NO_FATAL_FAILURE(Start(1, so));
  RawConn c(server_->port());
  ASSERT_EQ(c.Hello("bnps", 0, kToken).code(), 0);
  // 300,000 channels with want_running: the request (4.8 MB) fits a frame,
  // its answer (9.6 MB) does not.
  proto::BnRequest big = Forward(0, 1, std::vector<double>(300000, 1.0));
  big.set_want_running(true);
  c.Send(big);
  proto::BnResponse r = ParseResponse(c.Receive());
  EXPECT_EQ(r.id(), 1u);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(r.message().find("more than a message may"), std::string::npos)
      << r.message();
  // 20,000 channels with want_running (640 KB): over this connection's cap.
  proto::BnRequest wide = Forward(0, 2, std::vector<double>(20000, 1.0));
  wide.set_want_running(true);
  c.Send(wide);
  r = ParseResponse(c.Receive());
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(r.message().find("cap"), std::string::npos) << r.message();
  // Nothing was merged: the same step still works, and the connection too.
  c.Send(Forward(0, 3, {5.0}));
  r = ParseResponse(c.Receive());
  EXPECT_EQ(r.id(), 3u);
  EXPECT_EQ(r.code(), 0) << r.message();
}

// The longest token the docs allow (4,096 characters) settles the
// handshake; a hello of an older client that carries a token, up to the
// longest, is refused with its reason (the token would have crossed the
// wire); a byte more than the largest hello is refused.
TEST_F(BnSocketServerTest, TheLongestHelloIsAnsweredWithAReason) {
  const std::string longest(security::kMaxTokenBytes, 'k');
  ASSERT_TRUE(security::ValidateToken(longest).ok());
  ASSERT_NO_FATAL_FAILURE(Start(1, {}, longest));
  {
    RawConn c(server_->port());
    EXPECT_EQ(c.Hello("bnps", 0, longest).code(), 0);
  }
  proto::BnHello hello;
  hello.set_job("bnps");
  hello.set_worker(0);
  hello.set_generation(std::numeric_limits<int64_t>::max());
  hello.set_client_nonce(security::NewHelloNonce());
  hello.set_token(longest);
  EXPECT_GT(hello.ByteSizeLong(), 4096u);
  EXPECT_LE(hello.ByteSizeLong(), BnSocketServer::MaxHelloBytes("bnps"));
  {
    RawConn c(server_->port());
    c.Send(hello);
    const proto::BnHelloReply r = c.ReceiveReply();
    EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(r.message().find("carries no token"), std::string::npos) << r.message();
  }
  // One byte more than any valid hello: closed without a reply.
  RawConn c(server_->port());
  const size_t over = BnSocketServer::MaxHelloBytes("bnps") + 1;
  std::string frame(4, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((over >> (8 * i)) & 0xff);
  frame += std::string(over, 'x');
  c.SendAllowingFailure(frame);
  EXPECT_EQ(c.Receive(), std::nullopt);
  // The bound grows with the job's name, the only field without a limit
  // of its own that a valid hello must match.
  // (999 more characters, and a length of 2 bytes instead of 1.)
  EXPECT_EQ(BnSocketServer::MaxHelloBytes(std::string(1000, 'j')),
            BnSocketServer::MaxHelloBytes("j") + 999 + 1);
}

// The BN connections may never take the descriptors the
// gRPC listener and its connections need.
TEST(BnSocketServerCapTest, TheCapKeepsDescriptorsForTheRest) {
  EXPECT_EQ(BnSocketServer::ConnectionCap(1024), 480);
  EXPECT_EQ(BnSocketServer::ConnectionCap(256), 96);
  EXPECT_EQ(BnSocketServer::ConnectionCap(64), 0);
  EXPECT_EQ(BnSocketServer::ConnectionCap(10), 0);
  EXPECT_EQ(BnSocketServer::ConnectionCap(int64_t{1} << 40), 65536);
  for (int64_t limit : {100, 256, 1024, 4096, 1 << 20}) {
    const int cap = BnSocketServer::ConnectionCap(limit);
    EXPECT_LE(2 * cap + 64, limit) << limit;
  }
}

// A blocking TCP connection to the listener from the loopback address
// `from` (127.0.0.0/8 is all loopback: a peer of its own), or -1.
int ConnectFrom(const std::string& from, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  inet_pton(AF_INET, from.c_str(), &local.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    close(fd);
    return -1;
  }
  const timeval ten{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &ten, sizeof ten);
  return fd;
}

// Whether the server closed `fd` (a read sees the end or a reset within
// its timeout, not data).
bool ClosedByServer(int fd) {
  char b;
  return recv(fd, &b, 1, 0) <= 0;
}

TEST_F(BnSocketServerTest, ConnectionCapsAreTheWorkersAndEachPeersApart) {
  BnSocketServer::Options so;
  so.max_connections = 1;
  so.max_unauthenticated = 4;
  so.max_unauthenticated_per_peer = 2;
  ASSERT_NO_FATAL_FAILURE(Start(1, so));
  EXPECT_EQ(server_->max_connections(), 1);
  EXPECT_EQ(server_->max_unauthenticated(), 4);
  // One worker past its hello: the workers' cap is full, and a second
  // hello is refused with a reason (not closed unanswered).
  RawConn a(server_->port());
  ASSERT_EQ(a.Hello("bnps", 0, kToken).code(), 0);
  {
    RawConn b(server_->port());
    proto::BnHelloReply r = b.Hello("bnps", 0, kToken);
    EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted))
        << r.message();
  }
  // Two silent connections from 127.0.0.1 fill its own cap: a third from
  // it is closed on arrival.
  const int p1 = ConnectFrom("127.0.0.1", server_->port());
  const int p2 = ConnectFrom("127.0.0.1", server_->port());
  const int p3 = ConnectFrom("127.0.0.1", server_->port());
  ASSERT_GE(p1, 0);
  ASSERT_GE(p2, 0);
  ASSERT_GE(p3, 0);
  EXPECT_TRUE(ClosedByServer(p3));
  EXPECT_EQ(server_->refused(), 1);
  // Two from 127.0.0.2 fill the set of four; one from 127.0.0.3 then
  // closes the oldest (p1), not itself.
  const int q1 = ConnectFrom("127.0.0.2", server_->port());
  const int q2 = ConnectFrom("127.0.0.2", server_->port());
  const int r1 = ConnectFrom("127.0.0.3", server_->port());
  ASSERT_GE(q1, 0);
  ASSERT_GE(q2, 0);
  ASSERT_GE(r1, 0);
  EXPECT_TRUE(ClosedByServer(p1));
  EXPECT_EQ(server_->evicted(), 1);
  EXPECT_EQ(server_->refused(), 1);
  // The worker's connection never counted among them: it still works.
  a.Send(Forward(0, 7, {5.0}));
  EXPECT_EQ(ParseResponse(a.Receive()).code(), 0);
  for (int fd : {p1, p2, p3, q1, q2, r1}) close(fd);
}

TEST_F(BnSocketServerTest, ManyConnectionsBeforeTheirHelloLeaveTheWorkersBn) {
  // 4,000 connections, from 51 loopback addresses, each sending part of a
  // hello and no more; the test holds them all and the server up to its
  // own cap, so the descriptor limit is raised as far as it goes (and the
  // count scaled down, and said, if even that is short).
  rlimit lim{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
  ASSERT_NO_FATAL_FAILURE(Start(2));
  const int headroom = server_->max_unauthenticated() + 256;
  const int count = static_cast<int>(std::min<int64_t>(
      4000, static_cast<int64_t>(lim.rlim_cur) - headroom));
  ASSERT_GT(count, 2 * server_->max_unauthenticated());
  if (count < 4000) {
    std::printf("descriptor limit %lld: %d connections, not 4,000\n",
                static_cast<long long>(lim.rlim_cur), count);
  }
  RawConn a(server_->port());  // a worker there before the flood
  ASSERT_EQ(a.Hello("bnps", 0, kToken).code(), 0);
  // A frame header announcing 1,000 bytes, then 500 of them.
  std::string partial(4, '\0');
  partial[0] = static_cast<char>(1000 & 0xff);
  partial[1] = static_cast<char>(1000 >> 8);
  partial += std::string(500, 'h');
  std::vector<int> flood;
  flood.reserve(count);
  for (int i = 0; i < count; ++i) {
    // The first 500 from one address (past its own cap), then 50 others.
    const int host = i < 500 ? 2 : 3 + i % 50;
    const int fd = ConnectFrom(absl::StrCat("127.0.0.", host), server_->port());
    ASSERT_GE(fd, 0) << i << ": " << strerror(errno);
    (void)!send(fd, partial.data(), partial.size(), MSG_NOSIGNAL);
    flood.push_back(fd);
  }
  // A worker that comes after it is served, and the two meet.
  RawConn b(server_->port());
  proto::BnHelloReply r = b.Hello("bnps", 1, kToken);
  ASSERT_EQ(r.code(), 0) << r.message();
  auto [ra, rb] = bn_testing::MeetAtTheBarrier(a, b, 1, 2);
  EXPECT_EQ(ra.code(), 0) << ra.message();
  EXPECT_EQ(rb.code(), 0) << rb.message();
  // Each address past its cap was refused, the set's oldest made room,
  // and none of it was charged to the workers' budget.
  EXPECT_GT(server_->refused(), 0);
  EXPECT_GT(server_->evicted(), 0);
  // (The request last read is given back just after its answer is sent.)
  const absl::Time until = absl::Now() + absl::Seconds(2);
  while (server_->memory()->used() != 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(server_->memory()->used(), 0);
  for (int fd : flood) close(fd);
}

}  // namespace
}  // namespace bnps::server
