// A secured job on 127.0.0.1: the per-job token (security/job_token.h) guards
// every method, and TLS / mutual TLS (security/credentials.h) carry the same
// training calls as plaintext does. Certificates: tests/testdata/tls
// (make_certs.sh).

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/codec.h"
#include "security/credentials.h"
#include "security/call_session.h"
#include "security/job_token.h"
#include "server/server_runner.h"
#include "client/grpc_ps_client.h"
#include "client/job_reader.h"
#include "tests/token_session_testing.h"

namespace bnps {
namespace {

using grpc::StatusCode;
using client::Param;
using client::GrpcPsClient;

constexpr char kToken[] = "test-token-0123456789abcdef";

std::string Tls(const std::string& name) {
  return absl::StrCat("tests/testdata/tls/", name);
}

// One shard, one worker, sync; SGD without momentum so a step is w - 0.5 g.
std::unique_ptr<server::RunningServer> StartServer(
    server::ServerSecurity security) {
  server::ShardOptions o;
  o.num_workers = 1;
  o.barrier_timeout = absl::Seconds(5);
  o.optimizer.learning_rate = 0.5;
  o.optimizer.momentum = 0;
  auto s = server::RunningServer::Start(o, "127.0.0.1:0", std::move(security));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

client::GrpcClientOptions Options(const server::RunningServer& server,
                                std::string token,
                                std::shared_ptr<grpc::ChannelCredentials> c) {
  client::GrpcClientOptions o;
  o.servers = {absl::StrCat("127.0.0.1:", server.port())};
  o.job = "bnps";
  o.worker = 0;
  o.num_workers = 1;
  // Refused handshakes fail Connect once connect_timeout has passed.
  o.connect_timeout = absl::Seconds(3);
  o.rpc_timeout = absl::Seconds(3);
  o.max_attempts = 2;
  o.initial_backoff = absl::Milliseconds(10);
  o.credentials = std::move(c);
  o.token = std::move(token);
  return o;
}

std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(
    security::TlsFiles files) {
  auto c = security::MakeChannelCredentials(files);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    security::TlsFiles files) {
  auto c = security::MakeServerCredentials(files);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

// A training step's calls through `client`: init, push, pull (the SGD step
// applied), a BN forward exchange (W = 1: the merge is the local moments).
void ExpectAStepWorks(client::PsClient& client) {
  const std::map<std::string, Param> params = {{"w", {{2}, {1.0f, 2.0f}}}};
  ASSERT_TRUE(client.InitParameters(params).ok());
  ASSERT_TRUE(client.PushGradients(0, 1, params).ok());
  absl::StatusOr<std::map<std::string, Param>> pulled =
      client.PullParameters(1);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->at("w").values, (std::vector<float>{0.5f, 1.0f}));
  bn::Moments local;
  local.count = 4;
  local.mean = {1.5, -2.0};
  local.m2 = {3.0, 0.5};
  absl::StatusOr<client::BnForwardResult> merged =
      client.BnForward("bn0", 0, local);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->merged.count, 4);
  EXPECT_EQ(merged->merged.mean, local.mean);
  EXPECT_EQ(merged->merged.m2, local.m2);
}

// Raw calls to every method, each carrying `token` (none if empty).
class EveryMethod {
 public:
  EveryMethod(const server::RunningServer& server, std::string token)
      : stub_(proto::ParameterServer::NewStub(testing::TokenSessionChannel(
            absl::StrCat("127.0.0.1:", server.port()), 1))),
        token_(std::move(token)) {}

  // The status of each method's call, by name.
  std::map<std::string, StatusCode> Call() {
    std::map<std::string, StatusCode> out;
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::RegisterRequest req;
      req.set_job("bnps");
      req.set_num_workers(1);
      req.set_num_shards(1);
      req.set_incarnation(1);
      proto::RegisterResponse resp;
      out["Register"] = stub_->Register(&ctx, req, &resp).error_code();
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::HeartbeatRequest req;
      req.set_job("bnps");
      req.set_incarnation(1);
      proto::HeartbeatResponse resp;
      out["Heartbeat"] = stub_->Heartbeat(&ctx, req, &resp).error_code();
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::InitParametersRequest req;
      req.set_job("bnps");
      proto::NamedTensor* p = req.add_parameters();
      p->set_key("w");
      const int64_t shape[] = {1};
      proto::EncodeFloat32(std::vector<float>{1.0f}, shape, p->mutable_value());
      proto::InitParametersResponse resp;
      out["InitParameters"] =
          stub_->InitParameters(&ctx, req, &resp).error_code();
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::PushGradientsResponse resp;
      auto writer = stub_->PushGradients(&ctx, &resp);
      proto::PushGradientsRequest req;
      req.set_job("bnps");
      const int64_t shape[] = {1};
      proto::AppendChunks("w", shape, std::vector<float>{1.0f}, 1,
                          req.mutable_chunks());
      writer->Write(req);
      writer->WritesDone();
      out["PushGradients"] = writer->Finish().error_code();
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::PullParametersRequest req;
      req.set_job("bnps");
      auto reader = stub_->PullParameters(&ctx, req);
      proto::PullParametersResponse resp;
      while (reader->Read(&resp)) {
      }
      out["PullParameters"] = reader->Finish().error_code();
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      auto stream = stub_->BnSync(&ctx);
      proto::BnRequest req;
      req.set_job("bnps");
      req.set_layer("bn0");
      req.set_phase(proto::BN_RUNNING);
      stream->Write(req);
      stream->WritesDone();
      proto::BnResponse resp;
      while (stream->Read(&resp)) {
      }
      out["BnSync"] = stream->Finish().error_code();
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::StartStepRequest req;
      req.set_job("bnps");
      proto::StartStepResponse resp;
      out["StartStep"] = stub_->StartStep(&ctx, req, &resp).error_code();
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::FinishStepRequest req;
      req.set_job("bnps");
      proto::FinishStepResponse resp;
      out["FinishStep"] = stub_->FinishStep(&ctx, req, &resp).error_code();
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::StatusResponse resp;
      out["GetStatus"] =
          stub_->GetStatus(&ctx, proto::StatusRequest(), &resp).error_code();
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::RollbackRequest req;
      req.set_job("bnps");
      req.set_generation(1);
      proto::RollbackResponse resp;
      out["Rollback"] = stub_->Rollback(&ctx, req, &resp).error_code();
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::DigestResponse resp;
      out["GetDigest"] =
          stub_->GetDigest(&ctx, proto::DigestRequest(), &resp).error_code();
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::ReadStateRequest req;
      req.set_job("bnps");
      auto reader = stub_->ReadState(&ctx, req);
      proto::ReadStateResponse resp;
      while (reader->Read(&resp)) {
      }
      out["ReadState"] = reader->Finish().error_code();
    }
    {
      // An opening, confirmed with a proof under the token: only the
      // token's proof is taken.
      proto::SessionRequest open;
      open.mutable_hello()->set_job("bnps");
      open.mutable_hello()->set_client_nonce(security::NewHelloNonce());
      proto::SessionResponse challenge;
      grpc::ClientContext ctx;
      Prepare(&ctx);
      grpc::Status s = stub_->Session(&ctx, open, &challenge);
      if (s.ok()) {
        proto::SessionRequest confirm;
        confirm.set_session(challenge.session());
        confirm.mutable_proof()->set_proof(security::HandshakeProof(
            token_, "client",
            security::HelloTranscript(open.hello(), security::kSessionTransport,
                                      challenge.reply().server_nonce())));
        grpc::ClientContext again;
        Prepare(&again);
        s = stub_->Session(&again, confirm, &challenge);
      }
      out["Session"] = s.error_code();
    }
    {  // last: with the token, it ends the job of one worker
      grpc::ClientContext ctx;
      Prepare(&ctx);
      proto::LeaveRequest req;
      req.set_job("bnps");
      req.set_incarnation(1);
      proto::LeaveResponse resp;
      out["Leave"] = stub_->Leave(&ctx, req, &resp).error_code();
    }
    return out;
  }

  absl::StatusOr<proto::StatusResponse> Status() {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    proto::StatusResponse resp;
    grpc::Status s = stub_->GetStatus(&ctx, proto::StatusRequest(), &resp);
    if (!s.ok()) return proto::FromGrpcStatus(s);
    return resp;
  }

 private:
  // The channel turns the token into a session of it
  // (tests/token_session_testing.h).
  void Prepare(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    if (!token_.empty()) {
      ctx->AddMetadata(std::string(security::kTokenMetadataKey), token_);
    }
  }

  std::unique_ptr<proto::ParameterServer::Stub> stub_;
  std::string token_;
};

TEST(SecurityTest, TokenGuardsEveryMethod) {
  std::unique_ptr<server::RunningServer> server =
      StartServer({nullptr, kToken});
  ASSERT_NE(server, nullptr);
  for (const std::string& token :
       {std::string(), std::string("test-token-0123456789abcdeX"),
        std::string(kToken) + "0"}) {
    const std::map<std::string, StatusCode> got =
        EveryMethod(*server, token).Call();
    // Every RPC of the service is called: a new one must be added here.
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            proto::ParameterServer::service_full_name());
    ASSERT_NE(service, nullptr);
    std::set<std::string> rpcs;
    for (int i = 0; i < service->method_count(); ++i) {
      rpcs.insert(service->method(i)->name());
    }
    std::set<std::string> called;
    for (const auto& [method, code] : got) called.insert(method);
    EXPECT_EQ(called, rpcs);
    for (const auto& [method, code] : got) {
      EXPECT_EQ(code, StatusCode::UNAUTHENTICATED)
          << method << " with token '" << token << "'";
    }
  }
  // Nothing got through: no worker registered, no parameter created.
  absl::StatusOr<proto::StatusResponse> status =
      EveryMethod(*server, kToken).Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->num_parameters(), 0);
  EXPECT_FALSE(status->workers(0).registered());

  // With the token, every call reaches the shard's own checks.
  const std::map<std::string, StatusCode> got =
      EveryMethod(*server, kToken).Call();
  for (const auto& [method, code] : got) {
    EXPECT_NE(code, StatusCode::UNAUTHENTICATED) << method;
  }
  EXPECT_EQ(got.at("Register"), StatusCode::OK);
  EXPECT_EQ(got.at("InitParameters"), StatusCode::OK);
  EXPECT_EQ(got.at("GetStatus"), StatusCode::OK);
  EXPECT_EQ(got.at("ReadState"), StatusCode::OK);
  EXPECT_EQ(got.at("Leave"), StatusCode::OK);
}

// The read-only client needs the token like every call, and reads without
// joining: no worker registered, the parameters as the shard holds them.
TEST(SecurityTest, JobReaderNeedsTheTokenAndJoinsNothing) {
  std::unique_ptr<server::RunningServer> server =
      StartServer({nullptr, kToken});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(*server->shard().store().Init("w", {2}, {1.5f, -2.0f}));
  client::JobReaderOptions o;
  o.servers = {absl::StrCat("127.0.0.1:", server->port())};
  o.timeout = absl::Seconds(5);
  auto without = *client::JobReader::Create(o);
  EXPECT_EQ(without->ReadState().status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(without->GetDigest().status().code(),
            absl::StatusCode::kUnauthenticated);
  o.token = kToken;
  o.job = "other";
  EXPECT_EQ((*client::JobReader::Create(o))->ReadState().status().code(),
            absl::StatusCode::kInvalidArgument);
  o.job = "bnps";
  auto reader = *client::JobReader::Create(o);
  absl::StatusOr<client::JobState> state = reader->ReadState();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->params.at("w").values, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(state->params.at("w").shape, (std::vector<int64_t>{2}));
  EXPECT_FALSE(state->job_complete);
  absl::StatusOr<proto::StatusResponse> status = reader->GetStatus(0);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_FALSE(status->workers(0).registered());
  EXPECT_TRUE(reader->GetDigest().ok());
}

TEST(SecurityTest, ClientWithTheTokenTrainsAndWithoutItIsRefusedAtOnce) {
  std::unique_ptr<server::RunningServer> server =
      StartServer({nullptr, kToken});
  ASSERT_NE(server, nullptr);
  for (const std::string& token :
       {std::string(), std::string("another-jobs-token-0123456")}) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
        GrpcPsClient::Connect(Options(*server, token, nullptr));
    EXPECT_EQ(client.status().code(), absl::StatusCode::kUnauthenticated)
        << client.status();
    // Not retried: a wrong token does not heal.
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  }
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Connect(Options(*server, kToken, nullptr));
  ASSERT_TRUE(client.ok()) << client.status();
  ExpectAStepWorks(**client);
}

TEST(SecurityTest, BadTokensAreRefusedBeforeAnyCall) {
  std::unique_ptr<server::RunningServer> server = StartServer({});
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(
      GrpcPsClient::Connect(Options(*server, "short", nullptr)).status().code(),
      absl::StatusCode::kInvalidArgument);
  server::ShardOptions o;
  EXPECT_EQ(server::RunningServer::Start(o, "127.0.0.1:0",
                                         {nullptr, "has a space in it!!"})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SecurityTest, TlsWithTokenTrains) {
  std::unique_ptr<server::RunningServer> server = StartServer(
      {ServerCredentials({Tls("server.pem"), Tls("server.key"), ""}), kToken});
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client = GrpcPsClient::Connect(
      Options(*server, kToken, ClientCredentials({"", "", Tls("ca.pem")})));
  ASSERT_TRUE(client.ok()) << client.status();
  ExpectAStepWorks(**client);
}

TEST(SecurityTest, TlsServerRefusesPlaintextAndUntrustedClients) {
  std::unique_ptr<server::RunningServer> server = StartServer(
      {ServerCredentials({Tls("server.pem"), Tls("server.key"), ""}), ""});
  ASSERT_NE(server, nullptr);
  // A plaintext client, and one that does not trust the server's CA.
  for (std::shared_ptr<grpc::ChannelCredentials> c :
       {std::shared_ptr<grpc::ChannelCredentials>(),
        ClientCredentials({"", "", Tls("other_ca.pem")})}) {
    absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
        GrpcPsClient::Connect(Options(*server, "", c));
    EXPECT_FALSE(client.ok());
    EXPECT_TRUE(client.status().code() == absl::StatusCode::kUnavailable ||
                client.status().code() == absl::StatusCode::kDeadlineExceeded)
        << client.status();
  }
}

TEST(SecurityTest, MutualTlsNeedsAClientCertificateFromTheJobsCa) {
  std::unique_ptr<server::RunningServer> server = StartServer(
      {ServerCredentials({Tls("server.pem"), Tls("server.key"), Tls("ca.pem")}),
       ""});
  ASSERT_NE(server, nullptr);
  for (const security::TlsFiles& files :
       {security::TlsFiles{"", "", Tls("ca.pem")},
        security::TlsFiles{Tls("other_client.pem"), Tls("other_client.key"),
                        Tls("ca.pem")}}) {
    absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
        GrpcPsClient::Connect(Options(*server, "", ClientCredentials(files)));
    EXPECT_FALSE(client.ok()) << files.cert;
    // The server ends the handshake; the client sees the socket close.
    EXPECT_TRUE(client.status().code() == absl::StatusCode::kUnavailable ||
                client.status().code() == absl::StatusCode::kDeadlineExceeded)
        << client.status();
  }
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client = GrpcPsClient::Connect(
      Options(*server, "",
              ClientCredentials(
                  {Tls("client.pem"), Tls("client.key"), Tls("ca.pem")})));
  ASSERT_TRUE(client.ok()) << client.status();
  ExpectAStepWorks(**client);
}

}  // namespace
}  // namespace bnps
