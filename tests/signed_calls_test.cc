// A job with a token but without TLS on 127.0.0.1: the gRPC calls run under
// sessions (security/call_session.h), so the token never crosses the wire.
// A recorded call is refused when played again; a fake server hears no
// token and nothing that proves it; a worker's session acts for that worker
// alone; a restarted server's forgotten sessions are opened again and the
// job goes on to its end; many openings leave a worker's session working.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/grpc_ps_client.h"
#include "client/job_reader.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/codec.h"
#include "security/call_session.h"
#include "security/job_token.h"
#include "security/worker_token.h"
#include "server/server_runner.h"

namespace bnps {
namespace {

constexpr char kToken[] = "session-test-token-0123456789";
constexpr char kRegister[] = "/bnps.proto.ParameterServer/Register";
constexpr char kStatus[] = "/bnps.proto.ParameterServer/GetStatus";

std::unique_ptr<server::RunningServer> StartServer(
    int num_workers, bool per_worker, const std::string& address = "127.0.0.1:0",
    const std::string& checkpoint_dir = "") {
  server::ShardOptions o;
  o.num_workers = num_workers;
  o.barrier_timeout = absl::Seconds(5);
  o.optimizer.learning_rate = 0.5;
  o.optimizer.momentum = 0;
  o.checkpoint_dir = checkpoint_dir;
  o.checkpoint_every = checkpoint_dir.empty() ? 0 : 1;
  server::ServerSecurity security;
  security.token = kToken;
  security.per_worker_tokens = per_worker;
  auto s = server::RunningServer::Start(o, address, security);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

client::GrpcClientOptions Options(int port, int worker, int num_workers,
                                  std::string token) {
  client::GrpcClientOptions o;
  o.servers = {absl::StrCat("127.0.0.1:", port)};
  o.job = "bnps";
  o.worker = worker;
  o.num_workers = num_workers;
  o.token = std::move(token);
  o.connect_timeout = absl::Seconds(5);
  o.rpc_timeout = absl::Seconds(5);
  o.initial_backoff = absl::Milliseconds(20);
  return o;
}

// Raw calls of the test's own on a plaintext channel.
class Raw {
 public:
  explicit Raw(int port)
      : stub_(proto::ParameterServer::NewStub(
            grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                grpc::InsecureChannelCredentials()))) {}

  // A session of `worker` holding `token`, as the client library opens one.
  absl::StatusOr<std::unique_ptr<security::ClientSession>> Open(
      const std::string& token, int worker) {
    security::SessionOpener opener("bnps", worker, token, "the shard");
    proto::SessionResponse challenge, done;
    absl::Status s = Session(opener.Open(), &challenge);
    if (!s.ok()) return s;
    absl::StatusOr<proto::SessionRequest> confirm = opener.OnChallenge(challenge);
    if (!confirm.ok()) return confirm.status();
    if (s = Session(*confirm, &done); !s.ok()) return s;
    return opener.Confirmed();
  }

  absl::Status Session(const proto::SessionRequest& req,
                       proto::SessionResponse* resp) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    return proto::FromGrpcStatus(stub_->Session(&ctx, req, resp));
  }

  // Register as `worker`, the call carrying `auth` (kCallAuthMetadataKey)
  // and/or `token` (kTokenMetadataKey) where not empty.
  absl::Status Register(int worker, const std::string& auth,
                        const std::string& token = "") {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    if (!auth.empty()) {
      ctx.AddMetadata(std::string(security::kCallAuthMetadataKey), auth);
    }
    if (!token.empty()) {
      ctx.AddMetadata(std::string(security::kTokenMetadataKey), token);
    }
    proto::RegisterRequest req;
    req.set_job("bnps");
    req.set_worker(worker);
    req.set_num_workers(2);
    req.set_num_shards(1);
    req.set_incarnation(77 + worker);
    proto::RegisterResponse resp;
    return proto::FromGrpcStatus(stub_->Register(&ctx, req, &resp));
  }

  absl::Status GetStatus(const std::string& auth) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ctx.AddMetadata(std::string(security::kCallAuthMetadataKey), auth);
    proto::StatusResponse resp;
    return proto::FromGrpcStatus(
        stub_->GetStatus(&ctx, proto::StatusRequest(), &resp));
  }

 private:
  static void Deadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
  std::unique_ptr<proto::ParameterServer::Stub> stub_;
};

TEST(SignedCallsTest, ARecordedCallPlayedAgainIsRefused) {
  std::unique_ptr<server::RunningServer> server = StartServer(2, false);
  ASSERT_NE(server, nullptr);
  Raw raw(server->port());
  absl::StatusOr<std::unique_ptr<security::ClientSession>> session =
      raw.Open(kToken, 0);
  ASSERT_TRUE(session.ok()) << session.status();
  // The call's metadata as an eavesdropper records it.
  const std::string recorded = (*session)->Sign(kStatus, "");
  ASSERT_TRUE(raw.GetStatus(recorded).ok());
  absl::Status again = raw.GetStatus(recorded);
  EXPECT_EQ(again.code(), absl::StatusCode::kUnauthenticated) << again;
  EXPECT_NE(again.message().find("used before"), std::string::npos) << again;
  // Nor does it pass as another method, or on a new server's sessions.
  EXPECT_EQ(raw.Register(0, (*session)->Sign(kStatus, "")).code(),
            absl::StatusCode::kUnauthenticated);
  // The session's own next call goes on.
  EXPECT_TRUE(raw.GetStatus((*session)->Sign(kStatus, "")).ok());
}

// Session calls are counted with the other calls, refused ones by their
// code.
TEST(SignedCallsTest, SessionCallsAreCounted) {
  std::unique_ptr<server::RunningServer> server = StartServer(2, false);
  ASSERT_NE(server, nullptr);
  Raw raw(server->port());
  ASSERT_TRUE(raw.Open(kToken, 0).ok());  // an opening and a confirmation
  // A confirmation of no session the server opened.
  proto::SessionRequest unknown;
  unknown.set_session(12345);
  unknown.mutable_proof()->set_proof(std::string(32, 'x'));
  proto::SessionResponse resp;
  const absl::Status refused = raw.Session(unknown, &resp);
  ASSERT_FALSE(refused.ok());
  const std::string text = server->registry().TextExposition();
  EXPECT_NE(text.find("bnps_server_requests_total{method=\"Session\","
                      "code=\"OK\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(absl::StrCat(
                "bnps_server_requests_total{method=\"Session\",code=\"",
                absl::StatusCodeToString(refused.code()), "\"} 1\n")),
            std::string::npos)
      << refused << "\n" << text;
  EXPECT_NE(text.find("bnps_server_received_bytes_total{method=\"Session\""),
            std::string::npos)
      << text;
}

TEST(SignedCallsTest, ATokenSentWithoutTlsIsRefused) {
  std::unique_ptr<server::RunningServer> server = StartServer(2, false);
  ASSERT_NE(server, nullptr);
  absl::Status s = Raw(server->port()).Register(0, "", kToken);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_NE(s.message().find("older than the server"), std::string::npos) << s;
}

TEST(SignedCallsTest, AWorkersCallKeyActsForThatWorkerAlone) {
  std::unique_ptr<server::RunningServer> server = StartServer(2, true);
  ASSERT_NE(server, nullptr);
  Raw raw(server->port());
  const std::string one = security::WorkerToken(kToken, 1);
  // Worker 1's token cannot open a session as worker 0: the server proves
  // itself under worker 0's key, which it cannot check.
  EXPECT_EQ(raw.Open(one, 0).status().code(),
            absl::StatusCode::kUnauthenticated);
  absl::StatusOr<std::unique_ptr<security::ClientSession>> session =
      raw.Open(one, 1);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(raw.Register(0, (*session)->Sign(kRegister, "")).code(),
            absl::StatusCode::kPermissionDenied);
  absl::Status own = raw.Register(1, (*session)->Sign(kRegister, ""));
  EXPECT_TRUE(own.ok()) << own;
  // The client library with worker 0's own token joins as worker 0.
  absl::StatusOr<std::unique_ptr<client::GrpcPsClient>> client =
      client::GrpcPsClient::Connect(
          Options(server->port(), 0, 2, security::WorkerToken(kToken, 0)));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->InitParameters({{"w", {{2}, {1.0f, 2.0f}}}}).ok());
}

TEST(SignedCallsTest, ManyOpeningsLeaveAWorkersCallKeyWorking) {
  std::unique_ptr<server::RunningServer> server = StartServer(1, false);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::unique_ptr<client::GrpcPsClient>> client =
      client::GrpcPsClient::Connect(Options(server->port(), 0, 1, kToken));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->InitParameters({{"w", {{2}, {1.0f, 2.0f}}}}).ok());
  // A stranger opens far more sessions than the pool of openings holds.
  Raw raw(server->port());
  for (int i = 0; i < 600; ++i) {
    security::SessionOpener stranger("bnps", 0, "a-stranger-s-token-000", "s");
    proto::SessionResponse r;
    ASSERT_TRUE(raw.Session(stranger.Open(), &r).ok());
  }
  ASSERT_TRUE((*client)->PushGradients(0, 1, {{"w", {{2}, {1.0f, 2.0f}}}}).ok());
  absl::StatusOr<client::Params> pulled = (*client)->PullParameters({"w"}, 1);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->at("w").values, (std::vector<float>{0.5f, 1.0f}));
}

// A gRPC server posing as the shard: it records every call's method,
// metadata and message bytes, and answers a Session opening with a
// challenge whose proofs are made up (it holds no key).
class FakeShard final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* ctx) override {
    {
      absl::MutexLock lock(&mu_);
      methods_.push_back(ctx->method());
      for (const auto& [key, value] : ctx->client_metadata()) {
        absl::StrAppend(&heard_, std::string(key.data(), key.size()), ":",
                        std::string(value.data(), value.size()), "\n");
      }
    }
    return new Reactor(this, ctx->method());
  }

  std::string heard() const {
    absl::MutexLock lock(&mu_);
    return heard_;
  }
  std::vector<std::string> methods() const {
    absl::MutexLock lock(&mu_);
    return methods_;
  }

 private:
  class Reactor final : public grpc::ServerGenericBidiReactor {
   public:
    Reactor(FakeShard* fake, std::string method)
        : fake_(fake), method_(std::move(method)) {
      StartRead(&in_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      std::vector<grpc::Slice> slices;
      (void)in_.Dump(&slices);
      {
        absl::MutexLock lock(&fake_->mu_);
        for (const grpc::Slice& s : slices) {
          fake_->heard_.append(reinterpret_cast<const char*>(s.begin()),
                               s.size());
        }
      }
      if (method_ != "/bnps.proto.ParameterServer/Session") {
        Finish(grpc::Status::OK);
        return;
      }
      proto::SessionResponse resp;
      resp.set_session(42);
      resp.mutable_reply()->set_challenge(true);
      resp.mutable_reply()->set_server_nonce(std::string(32, 'n'));
      resp.mutable_reply()->set_job_proof(std::string(32, 'p'));
      const std::string bytes = resp.SerializeAsString();
      grpc::Slice slice(bytes);
      out_ = grpc::ByteBuffer(&slice, 1);
      StartWrite(&out_);
    }
    void OnWriteDone(bool) override { Finish(grpc::Status::OK); }
    void OnDone() override { delete this; }

   private:
    FakeShard* const fake_;
    const std::string method_;
    grpc::ByteBuffer in_, out_;
  };

  mutable absl::Mutex mu_;
  std::string heard_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> methods_ ABSL_GUARDED_BY(mu_);
};

TEST(SignedCallsTest, AFakeShardHearsNoTokenAndGetsNothingElse) {
  FakeShard fake;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterCallbackGenericService(&fake);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string own = security::WorkerToken(kToken, 0);
  for (const std::string& token : {std::string(kToken), own}) {
    client::GrpcClientOptions o = Options(port, 0, 1, token);
    o.connect_timeout = absl::Seconds(2);
    absl::StatusOr<std::unique_ptr<client::GrpcPsClient>> client =
        client::GrpcPsClient::Connect(o);
    EXPECT_EQ(client.status().code(), absl::StatusCode::kUnauthenticated)
        << client.status();
    client::JobReaderOptions r;
    r.servers = o.servers;
    r.token = token;
    r.timeout = absl::Seconds(2);
    EXPECT_EQ((*client::JobReader::Create(r))->GetStatus(0).status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  const std::string heard = fake.heard();
  // It heard the openings (the job's name), so it recorded what came...
  EXPECT_NE(heard.find("bnps"), std::string::npos);
  // ... but no token, and nothing made with one: every call was an opening.
  EXPECT_EQ(heard.find(kToken), std::string::npos);
  EXPECT_EQ(heard.find(own), std::string::npos);
  EXPECT_EQ(heard.find(std::string(security::kTokenMetadataKey)),
            std::string::npos);
  EXPECT_EQ(heard.find(std::string(security::kCallAuthMetadataKey)),
            std::string::npos);
  const std::vector<std::string> methods = fake.methods();
  ASSERT_FALSE(methods.empty());
  for (const std::string& m : methods) {
    EXPECT_EQ(m, "/bnps.proto.ParameterServer/Session");
  }
  server->Shutdown(std::chrono::system_clock::now());
}

TEST(SignedCallsTest, AfterAServerRestartTheClientOpensAnotherAndTheJobEnds) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/grpc_session_restart");
  std::unique_ptr<server::RunningServer> server =
      StartServer(1, false, "127.0.0.1:0", dir);
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  client::GrpcClientOptions o = Options(port, 0, 1, kToken);
  o.max_attempts = 20;
  absl::StatusOr<std::unique_ptr<client::GrpcPsClient>> client =
      client::GrpcPsClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  client::JobReaderOptions r;
  r.servers = o.servers;
  r.token = kToken;
  r.timeout = absl::Seconds(5);
  r.wait_for_ready = true;
  std::unique_ptr<client::JobReader> reader = *client::JobReader::Create(r);
  const client::Params w = {{"w", {{2}, {1.0f, 2.0f}}}};
  ASSERT_TRUE((*client)->InitParameters(w).ok());
  ASSERT_TRUE((*client)->PushGradients(0, 1, w).ok());
  ASSERT_TRUE((*client)->PullParameters({"w"}, 1).ok());
  ASSERT_TRUE(reader->GetStatus(0).ok());

  server->Shutdown();
  server.reset();
  server = StartServer(1, false, address, dir);  // resumes from step 1
  ASSERT_NE(server, nullptr);
  // The new server knows neither session: each client opens another.
  absl::StatusOr<proto::StatusResponse> status = reader->GetStatus(0);
  ASSERT_TRUE(status.ok()) << status.status();
  absl::StatusOr<int64_t> step = (*client)->Recover(/*restarted=*/false);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);
  ASSERT_TRUE((*client)->PushGradients(1, 1, w).ok());
  absl::StatusOr<client::Params> pulled = (*client)->PullParameters({"w"}, 2);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->at("w").values, (std::vector<float>{0.0f, 0.0f}));
  // The BN stream opens under the new session too.
  bn::Moments local;
  local.count = 4;
  local.mean = {1.5, -2.0};
  local.m2 = {3.0, 0.5};
  absl::StatusOr<client::BnForwardResult> merged =
      (*client)->BnForward("bn0", 2, local);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->merged.mean, local.mean);
  EXPECT_TRUE((*client)->Leave().ok());
  status = reader->GetStatus(0);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->job_complete());
}

}  // namespace
}  // namespace bnps
