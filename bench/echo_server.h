// The echo server: raw gRPC on 127.0.0.1 serving echo.proto's EchoService,
// built like the shard server (callback API, the shard server's message
// limits) and doing no work, so that a table's echo and star columns are the
// transport's floor under bnps. Echo sends each message back; Gather is the
// star barrier (star_barrier.h); Upload and Download move a gradient table
// row's bytes in messages of kEchoChunkBytes.
//
// Example:
//   absl::StatusOr<std::unique_ptr<EchoServer>> server = EchoServer::Start();
//   std::unique_ptr<EchoService::Stub> stub = (*server)->NewStub();
//
// Thread-safety: an EchoServer may be used from any thread; it serves on
// gRPC's threads.

#ifndef BNPS_BENCH_ECHO_SERVER_H_
#define BNPS_BENCH_ECHO_SERVER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "bench/echo.grpc.pb.h"

namespace bnps::bench {

// The most data bytes in one Blob of an Upload or a Download.
inline constexpr int64_t kEchoChunkBytes = 1 << 20;

// A stub of the echo server on 127.0.0.1:port, on a channel of its own with
// the shard server's message limits.
std::unique_ptr<EchoService::Stub> NewEchoStub(int port);

class EchoServer {
 public:
  // Binds a free port of 127.0.0.1. UNAVAILABLE if the server cannot start.
  static absl::StatusOr<std::unique_ptr<EchoServer>> Start();
  // Shuts down at once: calls still open are cancelled.
  ~EchoServer();

  int port() const { return port_; }
  std::unique_ptr<EchoService::Stub> NewStub() const {
    return NewEchoStub(port_);
  }

 private:
  class Service;

  EchoServer();

  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace bnps::bench

#endif  // BNPS_BENCH_ECHO_SERVER_H_
