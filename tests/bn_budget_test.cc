// The server's one memory budget: slow readers on the gRPC BnSync stream
// and on the raw-TCP connection share one bound, past which they are cut
// off; so do the recalibration moments, the layer names a BN stream keeps
// and the state copies of ReadState. What the server holds never exceeds
// it, each path past it is refused, a worker's exchange still works, and
// everything is given back.

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/bn_frame.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/codec.h"
#include "server/raw_bn_conn_testing.h"
#include "server/server_metrics.h"
#include "server/server_runner.h"
#include "util/eventually.h"

namespace bnps {
namespace {

proto::BnRequest Wide(int64_t step) {
  bn::Moments m;
  m.count = 4;
  m.mean.assign(10000, 1.0);  // 160 KB answers
  m.m2.assign(10000, 1.0);
  proto::BnRequest r;
  r.set_id(step + 1);
  r.set_job("bnps");
  r.set_worker(0);
  r.set_step(step);
  r.set_layer("bn1");
  r.set_phase(proto::BN_FORWARD);
  proto::EncodeMoments(m, r.mutable_moments());
  return r;
}

TEST(BnBudgetTest, SlowReadersOfBothTransportsShareOneBound) {
  server::ShardOptions o;
  o.num_workers = 1;
  server::ServerLatency latency;
  latency.bn_port = 0;
  server::ServerLimits limits;
  limits.bn_memory_budget_bytes = 1 << 20;
  auto s = server::RunningServer::Start(o, "127.0.0.1:0", {}, {}, latency,
                                        limits);
  ASSERT_TRUE(s.ok()) << s.status();
  server::RunningServer& server = **s;
  ASSERT_TRUE(server.shard().Register(0, /*incarnation=*/7).ok());
  int64_t peak = 0;

  // A BnSync stream that never reads: 60 answers of 160 KB (9.6 MB). gRPC's
  // own buffers take some; the rest would queue without the budget.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto stub = proto::ParameterServer::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", server.port()),
      grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  auto stream = stub->BnSync(&ctx);
  for (int step = 0; step < 60; ++step) {
    if (!stream->Write(Wide(step))) break;
    peak = std::max(peak, server.bn_memory().used());
  }
  // Its unread answers are held against the budget (most of it: the
  // stream's requests are refused once the next answer would not fit).
  EXPECT_TRUE(util::Eventually([&] {
    return server.bn_memory().used() > limits.bn_memory_budget_bytes / 2;
  })) << server.bn_memory().used();
  peak = std::max(peak, server.bn_memory().used());
  // The raw-TCP side, on top: more answers than the budget has left.
  {
    server::bn_testing::RawConn c(server.bn_socket_server()->port(), 4096);
    ASSERT_EQ(c.Hello("bnps", 0, "").code(), 0);
    std::string bytes;
    for (int step = 0; step < 40; ++step) {
      ASSERT_TRUE(proto::AppendFrame(Wide(step), &bytes).ok());
    }
    c.SendAllowingFailure(bytes);
    for (std::optional<std::string> a = c.Receive(); a.has_value();
         a = c.Receive()) {
      peak = std::max(peak, server.bn_memory().used());
      proto::BnResponse r;
      ASSERT_TRUE(r.ParseFromString(*a));
      if (r.id() == 40) break;
    }
  }
  EXPECT_LE(peak, limits.bn_memory_budget_bytes);
  EXPECT_GT(peak, 0);
  // Once both clients go, everything is given back but the layer's record.
  ctx.TryCancel();
  stream->Finish();
  EXPECT_TRUE(util::Eventually([&] {
    return server.bn_memory().used() == server.shard().bn().layer_bytes();
  })) << server.bn_memory().used();
}

// A server of one worker (registered) with a budget of 4 MiB, and a BnSync
// stream of that worker.
class BudgetedServer {
 public:
  BudgetedServer() {
    server::ShardOptions o;
    o.num_workers = 1;
    limits_.bn_memory_budget_bytes = 4 << 20;
    auto s = server::RunningServer::Start(o, "127.0.0.1:0", {}, {}, {},
                                          limits_);
    EXPECT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    EXPECT_TRUE(server_->shard().Register(0, /*incarnation=*/7).ok());
    stub_ = proto::ParameterServer::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                            grpc::InsecureChannelCredentials()));
    stream_ = stub_->BnSync(&ctx_);
  }
  ~BudgetedServer() {
    stream_->WritesDone();
    stream_->Finish().IgnoreError();
  }

  // One BN request of worker 0, answered.
  proto::BnResponse Exchange(const proto::BnRequest& r) {
    proto::BnResponse a;
    EXPECT_TRUE(stream_->Write(r));
    EXPECT_TRUE(stream_->Read(&a));
    return a;
  }
  // A worker's forward of 10,000 channels (a 160 KB answer) still works.
  void ExpectExchangeWorks(int64_t step) {
    proto::BnRequest forward = Wide(step);
    forward.set_id(9000 + step);
    const proto::BnResponse a = Exchange(forward);
    EXPECT_EQ(a.code(), 0) << a.message();
  }
  // Sends `r`: true if it was refused for the memory budget (saying so),
  // else expects it answered OK; the budget holds either way.
  bool RefusedForMemory(const proto::BnRequest& r) {
    const proto::BnResponse a = Exchange(r);
    EXPECT_LE(used(), limit());
    if (a.code() == static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED)) {
      EXPECT_NE(a.message().find("memory budget"), std::string::npos)
          << a.message();
      return true;
    }
    EXPECT_EQ(a.code(), 0) << a.message();
    return false;
  }
  int64_t used() const { return server_->bn_memory().used(); }
  // What stays charged while the stream is open: the layers, and the
  // stream's cached name of bn1.
  int64_t kept() const {
    return server_->shard().bn().layer_bytes() +
           server::ServerMetrics::LayerCache::kEntryBytes + 3;
  }
  int64_t limit() const { return limits_.bn_memory_budget_bytes; }
  server::RunningServer& server() { return *server_; }
  proto::ParameterServer::Stub& stub() { return *stub_; }

 private:
  server::ServerLimits limits_;
  std::unique_ptr<server::RunningServer> server_;
  std::unique_ptr<proto::ParameterServer::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<proto::BnRequest, proto::BnResponse>>
      stream_;
};

// ReadState: a state of 2 MiB takes three copies (6 MiB) while its answer
// is built: refused, saying which flag to raise; nothing held after.
TEST(BnBudgetTest, AStateReadPastTheBudgetIsRefused) {
  BudgetedServer b;
  const int64_t n = 512 << 10;
  ASSERT_TRUE(*b.server().shard().store().Init("w", {n},
                                               std::vector<float>(n, 1)));
  grpc::ClientContext ctx;
  proto::ReadStateRequest req;
  req.set_job("bnps");
  auto reader = b.stub().ReadState(&ctx, req);
  proto::ReadStateResponse resp;
  while (reader->Read(&resp)) {
  }
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("--bn_memory_budget_mb"),
            std::string::npos)
      << st.error_message();
  b.ExpectExchangeWorks(0);
  EXPECT_TRUE(util::Eventually([&] { return b.used() == b.kept(); }))
      << b.used();
}

// Layer names: 600 new layers of 4 KiB names would take 2.8 MB of layer
// records and cached names; they take at most half the budget, the rest
// are refused, and the worker's exchange on its own layer goes on.
TEST(BnBudgetTest, NewLayerNamesPastTheBudgetAreRefused) {
  BudgetedServer b;
  b.ExpectExchangeWorks(0);  // layer bn1 exists
  int refused = 0;
  for (int i = 0; i < 600; ++i) {
    proto::BnRequest r = Wide(1);
    r.set_id(1000 + i);
    r.set_layer(absl::StrCat(std::string(4096, 'n'), i));
    bn::Moments m;
    m.count = 4;
    m.mean.assign(1, 1.0);
    m.m2.assign(1, 1.0);
    proto::EncodeMoments(m, r.mutable_moments());
    if (b.RefusedForMemory(r)) ++refused;
  }
  EXPECT_GT(refused, 0);
  EXPECT_LT(refused, 600);
  EXPECT_TRUE(util::Eventually([&] { return b.used() <= b.limit() / 2; }))
      << b.used();
  b.ExpectExchangeWorks(1);
}

// Recalibration moments (160 KB a batch) take at most half the budget, the
// next are refused; the exchange goes on meanwhile, and RecalFinish gives
// them back.
TEST(BnBudgetTest, RecalMomentsPastTheBudgetAreRefused) {
  BudgetedServer b;
  b.ExpectExchangeWorks(0);
  int refused = 0;
  for (int batch = 0; batch < 20; ++batch) {
    proto::BnRequest r = Wide(batch);
    r.set_id(2000 + batch);
    r.set_phase(proto::BN_RECAL);
    if (b.RefusedForMemory(r)) ++refused;
  }
  EXPECT_GT(refused, 0);
  EXPECT_LT(refused, 20);
  b.ExpectExchangeWorks(1);
  proto::BnRequest finish = Wide(0);
  finish.set_id(3000);
  finish.set_phase(proto::BN_RECAL_FINISH);
  finish.clear_moments();
  const proto::BnResponse done = b.Exchange(finish);
  EXPECT_EQ(done.code(), 0) << done.message();
  EXPECT_TRUE(util::Eventually([&] { return b.used() == b.kept(); }))
      << b.used() << " != " << b.kept();
}

}  // namespace
}  // namespace bnps
