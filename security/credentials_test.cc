#include "security/credentials.h"

#include <chrono>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/slice.h"
#include "grpcpp/support/status.h"
#include "gtest/gtest.h"

namespace bnps::security {
namespace {

using ::testing::HasSubstr;

// Bazel runs a test in its workspace's runfiles directory.
std::string TlsPath(absl::string_view name) {
  return absl::StrCat("tests/testdata/tls/", name);
}

TlsFiles ServerTls() {
  return {TlsPath("server.pem"), TlsPath("server.key"), ""};
}
TlsFiles ServerMutualTls() {
  return {TlsPath("server.pem"), TlsPath("server.key"), TlsPath("ca.pem")};
}
TlsFiles ClientTrusting(absl::string_view ca) { return {"", "", TlsPath(ca)}; }
TlsFiles ClientWith(absl::string_view name) {
  return {TlsPath(absl::StrCat(name, ".pem")),
          TlsPath(absl::StrCat(name, ".key")), TlsPath("ca.pem")};
}

// A file under the test's temporary directory holding `contents`.
std::string WriteTempFile(absl::string_view name, absl::string_view contents) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  return path;
}

// Long enough for a handshake on a loaded machine; a rejected one fails
// fast, so the negative checks only need to outlast the first attempt.
constexpr auto kConnectTimeout = std::chrono::seconds(5);
constexpr auto kRejectTimeout = std::chrono::milliseconds(1500);

// A gRPC server on 127.0.0.1, on a port of the kernel's choice, that answers
// every call UNIMPLEMENTED. (gRPC will not start a server with nothing to
// serve, hence the generic service.)
class TestServer {
 public:
  explicit TestServer(const TlsFiles& files) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
        MakeServerCredentials(files);
    EXPECT_TRUE(creds.ok()) << creds.status();
    if (!creds.ok()) return;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *creds, &port_);
    builder.RegisterCallbackGenericService(&unimplemented_);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    EXPECT_GT(port_, 0);
  }
  ~TestServer() {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now());
    }
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int port_ = 0;
  grpc::CallbackGenericService unimplemented_;
  std::unique_ptr<grpc::Server> server_;
};

std::shared_ptr<grpc::Channel> Dial(const TestServer& server,
                                    const TlsFiles& files) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(files);
  EXPECT_TRUE(creds.ok()) << creds.status();
  if (!creds.ok()) return nullptr;
  grpc::ChannelArguments args;
  // A channel of its own: no subchannel (and connection) shared with
  // another test's channel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(server.address(), *creds, args);
}

template <typename Duration>
bool Connects(const TestServer& server, const TlsFiles& files,
              Duration timeout) {
  std::shared_ptr<grpc::Channel> channel = Dial(server, files);
  return channel != nullptr &&
         channel->WaitForConnected(std::chrono::system_clock::now() + timeout);
}

// The status of a call to a method the server does not have: UNIMPLEMENTED
// once the call got through TLS to the server, UNAVAILABLE if the
// connection was refused.
grpc::Status CallUnknownMethod(const TestServer& server,
                               const TlsFiles& files) {
  std::shared_ptr<grpc::Channel> channel = Dial(server, files);
  if (channel == nullptr) return grpc::Status(grpc::StatusCode::INTERNAL, "");
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kConnectTimeout);
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/bnps.NoSuchService/NoSuchMethod",
                 grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  return status;
}

TEST(CredentialsTest, UsesTls) {
  EXPECT_FALSE(UsesTls(TlsFiles{}));
  EXPECT_TRUE(UsesTls(TlsFiles{"a.pem", "", ""}));
  EXPECT_TRUE(UsesTls(TlsFiles{"", "a.key", ""}));
  EXPECT_TRUE(UsesTls(TlsFiles{"", "", "ca.pem"}));
}

TEST(CredentialsTest, NoPathsGivesInsecureCredentials) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server =
      MakeServerCredentials(TlsFiles{});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_NE(*server, nullptr);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channel =
      MakeChannelCredentials(TlsFiles{});
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_NE(*channel, nullptr);
}

TEST(CredentialsTest, LoneCertOrKeyIsInvalid) {
  const TlsFiles lone_cert{TlsPath("server.pem"), "", TlsPath("ca.pem")};
  const TlsFiles lone_key{"", TlsPath("server.key"), TlsPath("ca.pem")};
  for (const TlsFiles& files : {lone_cert, lone_key}) {
    absl::Status server = MakeServerCredentials(files).status();
    EXPECT_EQ(server.code(), absl::StatusCode::kInvalidArgument) << server;
    absl::Status channel = MakeChannelCredentials(files).status();
    EXPECT_EQ(channel.code(), absl::StatusCode::kInvalidArgument) << channel;
  }
  EXPECT_THAT(MakeServerCredentials(lone_cert).status().message(),
              HasSubstr("without a TLS key"));
  EXPECT_THAT(MakeChannelCredentials(lone_key).status().message(),
              HasSubstr("without a TLS certificate"));
}

TEST(CredentialsTest, ServerCaNeedsCertAndKey) {
  absl::Status s = MakeServerCredentials(ClientTrusting("ca.pem")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("ca.pem"));
  // A client may trust a CA without a certificate of its own.
  EXPECT_TRUE(MakeChannelCredentials(ClientTrusting("ca.pem")).ok());
}

TEST(CredentialsTest, MissingFileIsNotFoundNamingIt) {
  const std::string missing = TlsPath("no_such.key");
  absl::Status server =
      MakeServerCredentials({TlsPath("server.pem"), missing, ""}).status();
  EXPECT_EQ(server.code(), absl::StatusCode::kNotFound) << server;
  EXPECT_EQ(server.message(),
            absl::StrCat("TLS key '", missing,
                         "': cannot read: No such file or directory"));

  absl::Status channel =
      MakeChannelCredentials(ClientTrusting("no_such_ca.pem")).status();
  EXPECT_EQ(channel.code(), absl::StatusCode::kNotFound) << channel;
  EXPECT_THAT(channel.message(),
              HasSubstr(absl::StrCat("TLS CA '", TlsPath("no_such_ca.pem"))));
}

TEST(CredentialsTest, DirectoryIsNotFound) {
  absl::Status s =
      MakeChannelCredentials({"", "", ::testing::TempDir()}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("cannot read: Is a directory"));
}

TEST(CredentialsTest, NonPemFileIsInvalidArgument) {
  const std::string not_pem = WriteTempFile("not_pem.pem", "hello, world\n");
  const std::string empty = WriteTempFile("empty.pem", "");
  for (const std::string& path : {not_pem, empty}) {
    absl::Status server =
        MakeServerCredentials({path, TlsPath("server.key"), ""}).status();
    EXPECT_EQ(server.code(), absl::StatusCode::kInvalidArgument) << server;
    EXPECT_THAT(server.message(), HasSubstr(absl::StrCat("'", path, "'")));
    EXPECT_THAT(server.message(), HasSubstr("is not PEM"));
    absl::Status channel = MakeChannelCredentials({"", "", path}).status();
    EXPECT_EQ(channel.code(), absl::StatusCode::kInvalidArgument) << channel;
    EXPECT_THAT(channel.message(), HasSubstr("is not PEM"));
  }
}

TEST(CredentialsHandshakeTest, PlaintextConnects) {
  TestServer server(TlsFiles{});
  EXPECT_TRUE(Connects(server, TlsFiles{}, kConnectTimeout));
  EXPECT_FALSE(Connects(server, ClientTrusting("ca.pem"), kRejectTimeout));
}

TEST(CredentialsHandshakeTest, TlsClientTrustingCaConnects) {
  TestServer server(ServerTls());
  EXPECT_TRUE(Connects(server, ClientTrusting("ca.pem"), kConnectTimeout));
  // The server asks for no certificate; one offered does no harm.
  EXPECT_TRUE(Connects(server, ClientWith("client"), kConnectTimeout));
  EXPECT_EQ(CallUnknownMethod(server, ClientTrusting("ca.pem")).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST(CredentialsHandshakeTest, TlsClientTrustingOtherCaIsRefused) {
  TestServer server(ServerTls());
  EXPECT_FALSE(
      Connects(server, ClientTrusting("other_ca.pem"), kRejectTimeout));
  grpc::Status call = CallUnknownMethod(server, ClientTrusting("other_ca.pem"));
  EXPECT_EQ(call.error_code(), grpc::StatusCode::UNAVAILABLE)
      << call.error_message();
}

TEST(CredentialsHandshakeTest, TlsServerRefusesPlaintextClient) {
  TestServer server(ServerTls());
  EXPECT_FALSE(Connects(server, TlsFiles{}, kRejectTimeout));
  grpc::Status call = CallUnknownMethod(server, TlsFiles{});
  EXPECT_EQ(call.error_code(), grpc::StatusCode::UNAVAILABLE)
      << call.error_message();
}

TEST(CredentialsHandshakeTest, MutualTlsClientWithCertConnects) {
  TestServer server(ServerMutualTls());
  EXPECT_TRUE(Connects(server, ClientWith("client"), kConnectTimeout));
  EXPECT_EQ(CallUnknownMethod(server, ClientWith("client")).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST(CredentialsHandshakeTest, MutualTlsRefusesClientWithoutCert) {
  TestServer server(ServerMutualTls());
  EXPECT_FALSE(Connects(server, ClientTrusting("ca.pem"), kRejectTimeout));
  grpc::Status call = CallUnknownMethod(server, ClientTrusting("ca.pem"));
  EXPECT_EQ(call.error_code(), grpc::StatusCode::UNAVAILABLE)
      << call.error_message();
}

TEST(CredentialsHandshakeTest, MutualTlsRefusesCertFromOtherCa) {
  TestServer server(ServerMutualTls());
  const TlsFiles other{TlsPath("other_client.pem"), TlsPath("other_client.key"),
                       TlsPath("ca.pem")};
  EXPECT_FALSE(Connects(server, other, kRejectTimeout));
  grpc::Status call = CallUnknownMethod(server, other);
  EXPECT_EQ(call.error_code(), grpc::StatusCode::UNAVAILABLE)
      << call.error_message();
}

}  // namespace
}  // namespace bnps::security
