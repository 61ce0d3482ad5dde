// The server's BN memory budget across both transports: slow
// readers on the gRPC BnSync stream and on the raw-TCP connection share one
// bound, past which they are cut off; what the server holds never exceeds
// it, and it gives everything back.

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
  // Once both clients go, everything is given back.
  ctx.TryCancel();
  stream->Finish();
  EXPECT_TRUE(util::Eventually([&] { return server.bn_memory().used() == 0; }));
}

}  // namespace
}  // namespace bnps
