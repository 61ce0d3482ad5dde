// Each worker its own identity: with per-worker tokens
// (security/worker_token.h) a call may act only as the worker whose token it
// carries, on gRPC and on the raw-TCP BN connection, and a worker has one
// live BN connection per transport; independent of them, BN calls of a
// worker id that never registered are refused on both transports, and a
// raw-TCP connection acts as the worker its hello named. Real servers on
// 127.0.0.1.

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/grpc_ps_client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/codec.h"
#include "security/job_token.h"
#include "security/worker_token.h"
#include "server/raw_bn_conn_testing.h"
#include "server/server_runner.h"
#include "server/shard_service.h"
#include "tests/token_session_testing.h"

namespace bnps {
namespace {

using grpc::StatusCode;
using server::bn_testing::Forward;
using server::bn_testing::RawConn;

constexpr char kToken[] = "identity-test-token-0123456789";
constexpr int kDenied = static_cast<int>(absl::StatusCode::kPermissionDenied);
constexpr int kPrecondition =
    static_cast<int>(absl::StatusCode::kFailedPrecondition);

// A sync job of one shard and two workers, BN over TCP too.
class WorkerIdentityTest : public ::testing::Test {
 protected:
  void Start(bool per_worker_tokens) {
    server::ShardOptions o;
    o.num_workers = 2;
    o.barrier_timeout = absl::Seconds(5);
    server::ServerSecurity security;
    security.token = kToken;
    security.per_worker_tokens = per_worker_tokens;
    server::ServerLatency latency;
    latency.bn_port = 0;
    auto s = server::RunningServer::Start(o, "127.0.0.1:0", security, {},
                                          latency);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    stub_ = proto::ParameterServer::NewStub(testing::TokenSessionChannel(
        absl::StrCat("127.0.0.1:", server_->port()), 2));
  }
  int bn_port() { return server_->bn_socket_server()->port(); }

  // A raw gRPC call's context carrying `token` (which the channel turns
  // into a session of it, tests/token_session_testing.h).
  static std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata(std::string(security::kTokenMetadataKey), token);
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(10));
    return ctx;
  }

  grpc::Status Register(const std::string& token, int worker) {
    proto::RegisterRequest req;
    req.set_job("bnps");
    req.set_worker(worker);
    req.set_num_workers(2);
    req.set_num_shards(1);
    req.set_incarnation(1000 + worker);
    proto::RegisterResponse resp;
    return stub_->Register(As(token).get(), req, &resp);
  }

  std::unique_ptr<client::GrpcPsClient> Connect(int worker,
                                                const std::string& token) {
    client::GrpcClientOptions o;
    o.servers = {absl::StrCat("127.0.0.1:", server_->port())};
    o.job = "bnps";
    o.worker = worker;
    o.num_workers = 2;
    o.token = token;
    o.rpc_timeout = absl::Seconds(10);
    auto c = client::GrpcPsClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  std::unique_ptr<server::RunningServer> server_;
  std::unique_ptr<proto::ParameterServer::Stub> stub_;
};

proto::BnResponse Parse(const std::optional<std::string>& bytes) {
  proto::BnResponse r;
  EXPECT_TRUE(bytes.has_value());
  if (bytes) {
    EXPECT_TRUE(r.ParseFromString(*bytes));
  }
  return r;
}

TEST_F(WorkerIdentityTest, OverGrpcAWorkerTokenActsAsItsOwnWorkerOnly) {
  ASSERT_NO_FATAL_FAILURE(Start(/*per_worker_tokens=*/true));
  const std::string one = security::WorkerToken(kToken, 1);
  EXPECT_EQ(Register(one, 0).error_code(), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Register(one, 1).error_code(), StatusCode::OK);
  // Another worker's calls, unary and streaming.
  proto::HeartbeatRequest beat;
  beat.set_job("bnps");
  beat.set_worker(0);
  beat.set_incarnation(1000);
  proto::HeartbeatResponse beat_resp;
  EXPECT_EQ(stub_->Heartbeat(As(one).get(), beat, &beat_resp).error_code(),
            StatusCode::PERMISSION_DENIED);
  proto::PullParametersRequest pull;
  pull.set_job("bnps");
  pull.set_worker(0);
  {
    auto ctx = As(one);
    auto reader = stub_->PullParameters(ctx.get(), pull);
    proto::PullParametersResponse part;
    while (reader->Read(&part)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), StatusCode::PERMISSION_DENIED);
  }
  {
    auto ctx = As(one);
    auto stream = stub_->BnSync(ctx.get());
    ASSERT_TRUE(stream->Write(Forward(0, 5)));
    proto::BnResponse r;
    ASSERT_TRUE(stream->Read(&r));
    EXPECT_EQ(r.code(), kDenied) << r.message();
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  // An unknown token, or none, is no one.
  EXPECT_EQ(Register(security::WorkerToken(kToken, 2), 1).error_code(),
            StatusCode::UNAUTHENTICATED);
  // The job token (the operator's) still acts as any worker.
  EXPECT_EQ(Register(kToken, 0).error_code(), StatusCode::OK);
}

// Loss news (proto's WorkerLoss) is taken only under the finder's seal: a
// worker holding its own token cannot have another dropped by telling a
// shard that another shard lost it; news sealed with the job token, as
// shard 0 seals its own, is taken.
TEST_F(WorkerIdentityTest, AWorkerCannotForgeAnotherShardsLossNews) {
  server::ShardOptions o;
  o.num_workers = 2;
  o.num_shards = 2;
  o.shard = 1;
  server::ServerSecurity security;
  security.token = kToken;
  security.per_worker_tokens = true;
  auto s = server::RunningServer::Start(o, "127.0.0.1:0", security);
  ASSERT_TRUE(s.ok()) << s.status();
  auto stub = proto::ParameterServer::NewStub(testing::TokenSessionChannel(
      absl::StrCat("127.0.0.1:", (*s)->port()), 2));
  const std::string one = security::WorkerToken(kToken, 1);
  for (int w : {0, 1}) {
    proto::RegisterRequest req;
    req.set_job("bnps");
    req.set_worker(w);
    req.set_num_workers(2);
    req.set_num_shards(2);
    req.set_incarnation(1000 + w);
    proto::RegisterResponse resp;
    ASSERT_EQ(stub->Register(As(security::WorkerToken(kToken, w)).get(), req,
                             &resp)
                  .error_code(),
              StatusCode::OK);
  }
  // Worker 1 says shard 0 lost worker 0, sealed with `key`.
  auto beat = [&](const std::string& key) {
    proto::HeartbeatRequest req;
    req.set_job("bnps");
    req.set_worker(1);
    req.set_incarnation(1001);
    proto::WorkerLoss* loss = req.add_losses();
    loss->set_worker(0);
    loss->set_incarnation(1000);
    loss->set_shard(0);
    loss->set_reason("worker 0 was lost (no heartbeat for 10s)");
    if (!key.empty()) {
      loss->set_seal(security::Seal(
          key, absl::StrCat("loss:bnps:0:1000:0:", loss->reason())));
    }
    proto::HeartbeatResponse resp;
    EXPECT_EQ(stub->Heartbeat(As(one).get(), req, &resp).error_code(),
              StatusCode::OK);
    return resp;
  };
  for (const std::string& key : {std::string(), one}) {
    const proto::HeartbeatResponse resp = beat(key);
    EXPECT_EQ(resp.lost_size(), 0);
    EXPECT_EQ(resp.live_workers_size(), 2);
  }
  const proto::HeartbeatResponse resp = beat(kToken);
  ASSERT_EQ(resp.lost_size(), 1);
  EXPECT_EQ(resp.lost(0).worker(), 0);
  EXPECT_EQ(resp.lost(0).shard(), 0);
  EXPECT_EQ(resp.live_workers_size(), 1);
}

TEST_F(WorkerIdentityTest, OverGrpcAWorkerHasOneLiveBnStream) {
  ASSERT_NO_FATAL_FAILURE(Start(/*per_worker_tokens=*/true));
  const std::string zero = security::WorkerToken(kToken, 0);
  ASSERT_EQ(Register(zero, 0).error_code(), StatusCode::OK);
  proto::BnRequest read;
  read.set_id(1);
  read.set_job("bnps");
  read.set_worker(0);
  read.set_layer("bn1");
  read.set_phase(proto::BN_RUNNING);
  auto first_ctx = As(zero);
  auto first = stub_->BnSync(first_ctx.get());
  ASSERT_TRUE(first->Write(read));
  proto::BnResponse r;
  ASSERT_TRUE(first->Read(&r));  // the stream is live on the server
  {
    auto ctx = As(zero);
    auto second = stub_->BnSync(ctx.get());
    second->Write(read);
    while (second->Read(&r)) {
    }
    grpc::Status end = second->Finish();
    EXPECT_EQ(end.error_code(), StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(end.error_message().find("already has a live BN stream"),
              std::string::npos)
        << end.error_message();
  }
  first->WritesDone();
  EXPECT_TRUE(first->Finish().ok());
  // Once it ended, a new one is welcome (the server may take a moment to
  // see the end).
  bool welcome = false;
  for (int tries = 0; tries < 100 && !welcome; ++tries) {
    auto ctx = As(zero);
    auto again = stub_->BnSync(ctx.get());
    again->Write(read);
    welcome = again->Read(&r);
    again->WritesDone();
    while (again->Read(&r)) {
    }
    welcome = again->Finish().ok() && welcome;
    if (!welcome) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(welcome);
}

TEST_F(WorkerIdentityTest, OverTcpTheHelloBindsTheWorkerAndTheToken) {
  ASSERT_NO_FATAL_FAILURE(Start(/*per_worker_tokens=*/true));
  const std::string one = security::WorkerToken(kToken, 1);
  ASSERT_EQ(Register(one, 1).error_code(), StatusCode::OK);
  {
    RawConn c(bn_port());
    // Not its worker: the handshake binds worker 0's key, which worker 1's
    // token does not prove.
    EXPECT_EQ(c.Hello("bnps", 0, one).code(),
              static_cast<int>(absl::StatusCode::kUnauthenticated));
    EXPECT_EQ(c.Receive(), std::nullopt);
  }
  RawConn c(bn_port());
  ASSERT_EQ(c.Hello("bnps", 1, one).code(), 0);
  {
    RawConn second(bn_port());
    proto::BnHelloReply r = second.Hello("bnps", 1, one);
    EXPECT_EQ(r.code(), kPrecondition);
    EXPECT_NE(r.message().find("already has a live BN connection"),
              std::string::npos)
        << r.message();
    EXPECT_EQ(second.Receive(), std::nullopt);
  }
  // Requests as another worker on this connection are refused.
  c.Send(Forward(0, 3));
  proto::BnResponse r = Parse(c.Receive());
  EXPECT_EQ(r.id(), 3u);
  EXPECT_EQ(r.code(), kDenied) << r.message();
  // The job token may say hello as any worker, more than once.
  RawConn op1(bn_port()), op2(bn_port());
  EXPECT_EQ(op1.Hello("bnps", 0, kToken).code(), 0);
  EXPECT_EQ(op2.Hello("bnps", 0, kToken).code(), 0);
}

// Job-wide operations need the job's authority (server/rollback_authority.h):
// with no failure seen, a worker's own token may start no generation, nor
// grow the job (worker 1 is no joining member here), nor jump generations;
// no token may name a generation past the bound. The job token passes the
// authority check (this server keeps no checkpoints, so its roll-back then
// fails with FAILED_PRECONDITION). tests/job_authority_test runs the same
// against servers with checkpoints, where the allowed roll-backs succeed.
TEST_F(WorkerIdentityTest, AWorkerTokenCannotRollBackResizeOrPushTheGeneration) {
  ASSERT_NO_FATAL_FAILURE(Start(/*per_worker_tokens=*/true));
  const std::string one = security::WorkerToken(kToken, 1);
  auto rollback = [&](const std::string& token, int64_t generation,
                      int resize_to) {
    proto::RollbackRequest req;
    req.set_job("bnps");
    req.set_worker(1);
    req.set_generation(generation);
    req.set_step(-1);
    req.set_resize_to(resize_to);
    proto::RollbackResponse resp;
    return stub_->Rollback(As(token).get(), req, &resp).error_code();
  };
  EXPECT_EQ(rollback(one, INT64_MAX, 0), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(rollback(kToken, INT64_MAX, 0), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(rollback(one, -1, 0), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(rollback(one, 2, 0), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(rollback(one, 1, 3), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(rollback(one, 1, 0), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(rollback(one, 1, 2), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(rollback(kToken, 5, 2), StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(server_->shard().generation().generation, 0);
}

// ReadState calls at once are bounded: each holds a copy of the
// shard's state until its client has read them, so past the limit a call is
// refused (RESOURCE_EXHAUSTED) rather than growing the server's memory, and
// a call that ends frees its place. The state is larger than the
// transport's buffers, so a stream whose client stops reading stays open.
TEST_F(WorkerIdentityTest, ReadStateCallsAtOnceAreBounded) {
  ASSERT_NO_FATAL_FAILURE(Start(/*per_worker_tokens=*/false));
  // 32 MiB of floats: three copies of it (while an answer is built) fit
  // the server's memory budget beside the streams already open.
  const int64_t n = int64_t{8} << 20;
  ASSERT_TRUE(*server_->shard().store().Init("w", {n},
                                             std::vector<float>(n, 1.0f)));
  proto::ReadStateRequest req;
  req.set_job("bnps");
  proto::ReadStateResponse resp;
  constexpr int kMax = server::ShardService::kMaxConcurrentReadStates;
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientReader<proto::ReadStateResponse>>>
      open;
  for (int i = 0; i < kMax; ++i) {  // each reads one message, then waits
    ctxs.push_back(As(kToken));
    open.push_back(stub_->ReadState(ctxs.back().get(), req));
    ASSERT_TRUE(open.back()->Read(&resp)) << i;
  }
  auto read_all = [&]() {
    auto ctx = As(kToken);
    auto reader = stub_->ReadState(ctx.get(), req);
    while (reader->Read(&resp)) {
    }
    return reader->Finish();
  };
  const grpc::Status refused = read_all();
  EXPECT_EQ(refused.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("ReadState calls are under way"),
            std::string::npos)
      << refused.error_message();
  while (open[0]->Read(&resp)) {
  }
  ASSERT_TRUE(open[0]->Finish().ok());
  // The server lets go of the ended call just after its client has the end.
  grpc::Status next = read_all();
  for (int tries = 0; tries < 100 && !next.ok(); ++tries) {
    absl::SleepFor(absl::Milliseconds(20));
    next = read_all();
  }
  EXPECT_TRUE(next.ok()) << next.error_message();
  ctxs[1]->TryCancel();
  open[1]->Finish();
}

// Without per-worker tokens: a connection still acts as its hello's worker,
// and a worker id that never registered takes no part in BN on either
// transport, so the real worker can still join.
TEST_F(WorkerIdentityTest, UnregisteredIdsTakeNoPartOnEitherTransport) {
  ASSERT_NO_FATAL_FAILURE(Start(/*per_worker_tokens=*/false));
  ASSERT_EQ(Register(kToken, 0).error_code(), StatusCode::OK);
  RawConn c(bn_port());
  ASSERT_EQ(c.Hello("bnps", 0, kToken).code(), 0);
  c.Send(Forward(1, 4));  // another worker than the hello's
  EXPECT_EQ(Parse(c.Receive()).code(), kDenied);
  {
    RawConn as1(bn_port());
    ASSERT_EQ(as1.Hello("bnps", 1, kToken).code(), 0);
    as1.Send(Forward(1, 6));  // worker 1 never registered
    proto::BnResponse r = Parse(as1.Receive());
    EXPECT_EQ(r.code(), kPrecondition);
    EXPECT_NE(r.message().find("has not registered"), std::string::npos)
        << r.message();
  }
  {
    auto ctx = As(kToken);
    auto stream = stub_->BnSync(ctx.get());
    ASSERT_TRUE(stream->Write(Forward(1, 7)));
    proto::BnResponse r;
    ASSERT_TRUE(stream->Read(&r));
    EXPECT_EQ(r.code(), kPrecondition) << r.message();
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  // Worker 1 then joins: nothing marked it as having taken part.
  auto w1 = Connect(1, kToken);
  EXPECT_NE(w1, nullptr);
}

// The worker's client takes the derived token as it takes the job token:
// two workers, each with only its own, run a BN exchange over TCP.
TEST_F(WorkerIdentityTest, WorkersWithTheirOwnTokensTrain) {
  ASSERT_NO_FATAL_FAILURE(Start(/*per_worker_tokens=*/true));
  std::vector<std::unique_ptr<client::GrpcPsClient>> clients;
  for (int w = 0; w < 2; ++w) {
    clients.push_back(Connect(w, security::WorkerToken(kToken, w)));
    ASSERT_NE(clients.back(), nullptr);
  }
  std::vector<absl::StatusOr<client::BnForwardResult>> got(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      bn::Moments m;
      m.count = 4;
      m.mean = {1.0 + w, 2.0};
      m.m2 = {1.0, 1.0};
      got[w] = clients[w]->BnForward("bn1", 0, m);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(got[w].ok()) << got[w].status();
    EXPECT_EQ(got[w]->contributors, 2);
    EXPECT_EQ(got[w]->merged.mean[0], 1.5);
  }
  EXPECT_EQ(server_->bn_socket_server()->accepted(), 2);
}

}  // namespace
}  // namespace bnps
