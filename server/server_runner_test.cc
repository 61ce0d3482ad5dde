// RunningServer on 127.0.0.1: starting, refusing an address in use, the
// standard health service and server reflection (called with raw bytes, as
// any client would, so the test needs no generated code of theirs).

#include "server/server_runner.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "util/eventually.h"

namespace bnps::server {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

std::string String(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  b.Dump(&slices).IgnoreError();
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

std::shared_ptr<grpc::Channel> Connect(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                             grpc::InsecureChannelCredentials());
}

// grpc.health.v1.Health/Check for `service`: the status number (1 SERVING,
// 2 NOT_SERVING), or -code for a failed call.
int HealthCheck(int port, const std::string& service) {
  auto channel = Connect(port);
  grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                   grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  // HealthCheckRequest { string service = 1; }
  const std::string req = absl::StrCat(
      std::string(1, '\x0a'), std::string(1, static_cast<char>(service.size())),
      service);
  grpc::ByteBuffer resp;
  grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer,
                                                    grpc::ByteBuffer>(
      channel.get(), method, &ctx, Bytes(req), &resp);
  if (!s.ok()) return -static_cast<int>(s.error_code());
  // HealthCheckResponse { ServingStatus status = 1; }
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromString(String(resp))) return -100;
  for (int i = 0; i < fields.field_count(); ++i) {
    if (fields.field(i).number() == 1) return fields.field(i).varint();
  }
  return 0;  // UNKNOWN, the default, is not sent
}

// One server reflection exchange: sends `request` (a serialized
// ServerReflectionRequest) and returns the answer's bytes.
std::string Reflect(int port, const std::string& request) {
  auto channel = Connect(port);
  grpc::internal::RpcMethod method(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
      stream(grpc::internal::ClientReaderWriterFactory<
             grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel.get(), method,
                                                         &ctx));
  stream->Write(Bytes(request));
  stream->WritesDone();
  std::string answer;
  grpc::ByteBuffer resp;
  if (stream->Read(&resp)) answer = String(resp);
  while (stream->Read(&resp)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
  return answer;
}

// The length-delimited values of field `number` in the message `bytes`.
std::vector<std::string> Strings(const std::string& bytes, int number) {
  google::protobuf::UnknownFieldSet fields;
  fields.ParseFromString(bytes);
  std::vector<std::string> out;
  for (int i = 0; i < fields.field_count(); ++i) {
    if (fields.field(i).number() == number &&
        fields.field(i).type() ==
            google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      out.push_back(fields.field(i).length_delimited());
    }
  }
  return out;
}

// ServerReflectionRequest { string file_containing_symbol = 4; string
// list_services = 7; }  ServerReflectionResponse { FileDescriptorResponse
// file_descriptor_response = 4; ListServiceResponse list_services_response =
// 6; }  ListServiceResponse { repeated ServiceResponse service = 1; }
// ServiceResponse { string name = 1; }  FileDescriptorResponse { repeated
// bytes file_descriptor_proto = 1; }
std::vector<std::string> ReflectedServices(int port) {
  std::vector<std::string> names;
  for (const std::string& list :
       Strings(Reflect(port, std::string("\x3a\x00", 2)), 6)) {
    for (const std::string& service : Strings(list, 1)) {
      for (const std::string& name : Strings(service, 1)) {
        names.push_back(name);
      }
    }
  }
  return names;
}

// The file descriptors (serialized FileDescriptorProtos) reflection gives for
// `symbol`.
std::vector<std::string> ReflectedFiles(int port, const std::string& symbol) {
  std::vector<std::string> files;
  const std::string request = absl::StrCat(
      std::string(1, '\x22'), std::string(1, static_cast<char>(symbol.size())),
      symbol);
  for (const std::string& r : Strings(Reflect(port, request), 4)) {
    for (const std::string& f : Strings(r, 1)) files.push_back(f);
  }
  return files;
}

TEST(RunningServerTest, PortZeroPicksAFreePort) {
  absl::StatusOr<std::unique_ptr<RunningServer>> server =
      RunningServer::Start(ShardOptions(), "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
}

TEST(RunningServerTest, AddressInUseIsAnError) {
  // gRPC binds with SO_REUSEPORT by default: a second server on the same port
  // would start and the kernel would split the connections between the two
  // jobs.
  absl::StatusOr<std::unique_ptr<RunningServer>> first =
      RunningServer::Start(ShardOptions(), "127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<RunningServer>> second =
      RunningServer::Start(ShardOptions(), address);
  ASSERT_FALSE(second.ok()) << "a second server started on " << address;
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(address));
  EXPECT_THAT(second.status().message(), HasSubstr("in use"));
}

TEST(RunningServerTest, HealthIsServingOnceStartedAndFollowsSetServing) {
  absl::StatusOr<std::unique_ptr<RunningServer>> server =
      RunningServer::Start(ShardOptions(), "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  constexpr int kServing = 1, kNotServing = 2;
  EXPECT_EQ(HealthCheck(port, ""), kServing);
  EXPECT_EQ(HealthCheck(port, "bnps.proto.ParameterServer"), kServing);
  EXPECT_EQ(HealthCheck(port, "no.such.Service"),
            -static_cast<int>(grpc::StatusCode::NOT_FOUND));
  (*server)->SetServing(false);
  EXPECT_EQ(HealthCheck(port, ""), kNotServing);
  EXPECT_EQ(HealthCheck(port, "bnps.proto.ParameterServer"), kNotServing);
  (*server)->SetServing(true);
  EXPECT_EQ(HealthCheck(port, "bnps.proto.ParameterServer"), kServing);
}

TEST(RunningServerTest, ReflectionListsTheServices) {
  absl::StatusOr<std::unique_ptr<RunningServer>> server =
      RunningServer::Start(ShardOptions(), "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<std::string> services = ReflectedServices((*server)->port());
  EXPECT_THAT(services, Contains("bnps.proto.ParameterServer"));
  EXPECT_THAT(services, Contains("grpc.health.v1.Health"));
  // What grpcurl needs to call the methods: the .proto that defines them.
  const std::vector<std::string> files =
      ReflectedFiles((*server)->port(), "bnps.proto.ParameterServer");
  ASSERT_FALSE(files.empty());
  EXPECT_THAT(files[0], HasSubstr("proto/bnps.proto"));
  EXPECT_THAT(files[0], HasSubstr("PushGradients"));
}

TEST(RunningServerTest, MetricsCanBeTurnedOff) {
  absl::StatusOr<std::unique_ptr<RunningServer>> on =
      RunningServer::Start(ShardOptions(), "127.0.0.1:0");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_NE((*on)->metrics(), nullptr);
  EXPECT_THAT((*on)->registry().TextExposition(),
              HasSubstr("bnps_server_workers{state=\"unregistered\"} 1"));
  ServerMonitoring off;
  off.metrics = false;
  absl::StatusOr<std::unique_ptr<RunningServer>> none =
      RunningServer::Start(ShardOptions(), "127.0.0.1:0", {}, off);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ((*none)->metrics(), nullptr);
  EXPECT_EQ((*none)->registry().TextExposition(), "");
}

// What the BN connections hold is a gauge, bounded by the
// budget the limits set.
TEST(RunningServerTest, TheBnBudgetIsSetAndExposed) {
  ServerLatency latency;
  latency.bn_port = 0;
  ServerLimits limits;
  limits.bn_memory_budget_bytes = 3 << 20;
  limits.bn_max_connections = 7;
  absl::StatusOr<std::unique_ptr<RunningServer>> s = RunningServer::Start(
      ShardOptions(), "127.0.0.1:0", {}, {}, latency, limits);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_NE((*s)->bn_socket_server(), nullptr);
  EXPECT_EQ((*s)->bn_socket_server()->memory()->limit(), 3 << 20);
  EXPECT_EQ((*s)->bn_socket_server()->max_connections(), 7);
  EXPECT_THAT((*s)->registry().TextExposition(),
              HasSubstr("bnps_server_bn_buffered_bytes 0"));
  limits.bn_memory_budget_bytes = 0;
  EXPECT_EQ(RunningServer::Start(ShardOptions(), "127.0.0.1:0", {}, {},
                                 latency, limits)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RunningServerTest, TheBnUnixSocketNeedsTheTcpListener) {
  ServerLatency latency;
  latency.bn_unix_path = "auto";
  EXPECT_EQ(RunningServer::Start(ShardOptions(), "127.0.0.1:0", {}, {},
                                 latency)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  latency.bn_port = 0;
  absl::StatusOr<std::unique_ptr<RunningServer>> s =
      RunningServer::Start(ShardOptions(), "127.0.0.1:0", {}, {}, latency);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_NE((*s)->bn_socket_server(), nullptr);
  EXPECT_FALSE((*s)->bn_socket_server()->unix_path().empty());
}

TEST(RunningServerTest, KeepAwakeIsOffByDefaultAndRefusesANegativeHold) {
  absl::StatusOr<std::unique_ptr<RunningServer>> plain =
      RunningServer::Start(ShardOptions(), "127.0.0.1:0");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->keep_awake(), nullptr);
  ServerLatency negative;
  negative.keep_awake = absl::Milliseconds(-1);
  EXPECT_EQ(RunningServer::Start(ShardOptions(), "127.0.0.1:0", {}, {},
                                 negative)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A call wakes the keeper, and so does each message of a BN stream: after
// the stream's start has been held for and the keeper sleeps again, one
// more message makes it busy again.
TEST(RunningServerTest, CallsAndBnMessagesKeepTheCpusAwake) {
  ServerLatency latency;
  latency.keep_awake = absl::Milliseconds(20);
  absl::StatusOr<std::unique_ptr<RunningServer>> server =
      RunningServer::Start(ShardOptions(), "127.0.0.1:0", {}, {}, latency);
  ASSERT_TRUE(server.ok()) << server.status();
  const util::KeepAwake* k = (*server)->keep_awake();
  ASSERT_NE(k, nullptr);
  const int n = static_cast<int>(k->cpus().size());
  ASSERT_TRUE(util::Eventually([&] { return k->sleeping() == n; }));
  EXPECT_EQ(k->busy(), absl::ZeroDuration());

  auto channel = Connect((*server)->port());
  grpc::internal::RpcMethod method("/bnps.proto.ParameterServer/BnSync",
                                   grpc::internal::RpcMethod::BIDI_STREAMING);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
      stream(grpc::internal::ClientReaderWriterFactory<
             grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel.get(), method,
                                                         &ctx));
  ASSERT_TRUE(util::Eventually([&] { return k->busy() > absl::ZeroDuration(); }));
  ASSERT_TRUE(util::Eventually([&] { return k->sleeping() == n; }));
  const absl::Duration after_call = k->busy();

  // Bytes that are no BnRequest: the server ends the stream, after the
  // message has touched the keeper.
  ASSERT_TRUE(stream->Write(Bytes(std::string("\xff\xff\xff", 3))));
  EXPECT_TRUE(util::Eventually([&] { return k->busy() > after_call; }));
  grpc::ByteBuffer resp;
  while (stream->Read(&resp)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace bnps::server
