// Runs a shard server: the Shard, its gRPC service and the grpc::Server, with
// message limits set explicitly. Used by the bnps_server binary and by tests
// that start real servers on 127.0.0.1.
//
// Besides the ParameterServer service, the server answers the standard
// health check (grpc.health.v1.Health, gRPC's default implementation) and
// server reflection (grpc.reflection.v1alpha, so grpcurl can list and call
// the methods). Health: the server listens only once it has its
// configuration (the Shard exists), so both the overall status ("") and
// "bnps.proto.ParameterServer" are SERVING from the first call on, until
// Shutdown (NOT_SERVING) or SetServing(false). The metrics of the calls
// (server/server_metrics.h) are kept in registry(), which bnps_server serves
// over HTTP when asked (--metrics_port).
//
// Thread-safety: Shutdown may be called from any thread, once or more.

#ifndef BNPS_SERVER_SERVER_RUNNER_H_
#define BNPS_SERVER_SERVER_RUNNER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "metrics/registry.h"
#include "server/bn_socket_server.h"
#include "server/server_metrics.h"
#include "server/shard.h"
#include "util/byte_budget.h"
#include "util/keep_awake.h"

// Declared, not included: the gRPC server's headers cost every test that
// starts a server seconds of compile time (security/credentials.h makes the
// credentials).
namespace grpc {
class Server;
class ServerCredentials;
}  // namespace grpc

namespace bnps::server {

class ShardService;  // server/shard_service.h

// How a server admits calls.
struct ServerSecurity {
  // TLS or mutual TLS (security/credentials.h); nullptr: plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // The job token every call must carry (security/job_token.h); empty: none.
  std::string token;
  // With `token`: each worker may carry its own token instead
  // (security/worker_token.h), which acts as that worker alone, on gRPC and
  // on the raw-TCP BN connection, with one live BN connection per worker
  // and transport. The job token still acts as any worker (operators,
  // tools). Default: false.
  bool per_worker_tokens = false;
};

// What the server measures.
struct ServerMonitoring {
  // Count and time the calls (server/server_metrics.h); off, GetStatus has
  // no per-worker steps, pushes or BN waits. Default: true. Off only to
  // measure what metrics cost.
  bool metrics = true;
};

// How the server trades CPU for latency.
struct ServerLatency {
  // Above zero: after each call and each BN message, keep the CPUs the
  // process may run on out of idle for this long (util/keep_awake.h), so
  // the next message is answered without waking a CPU. For servers with
  // CPUs of their own. Zero: off.
  absl::Duration keep_awake = absl::ZeroDuration();
  // At least 0: also serve BN traffic over raw TCP on this port of the
  // server's host (0: a free one), advertised to the workers when they
  // register (server/bn_socket_server.h). Plaintext jobs only. -1: off.
  int bn_port = -1;
  // With bn_port: also serve it on a Unix stream socket at this path, for
  // the workers of this host ("auto": a path of the process and port under
  // $XDG_RUNTIME_DIR or /tmp; BnSocketServer::Options::unix_path). Empty:
  // none.
  std::string bn_unix_path;
};

// What the server lets clients hold (a flood of
// connections is refused or shed, not let grow without bound).
struct ServerLimits {
  // Most raw-TCP BN connections open at once; 0: derived from the soft
  // RLIMIT_NOFILE (BnSocketServer::ConnectionCap), which bnps_server raises
  // to the hard limit first.
  int bn_max_connections = 0;
  // Most raw-TCP BN connections before their hello from one address
  // (BnSocketServer::Options::max_unauthenticated_per_peer).
  int bn_max_unauthenticated_per_peer = 64;
  // The server's one memory budget for what clients make it hold: all BN
  // connections' (raw TCP and BnSync streams) unread answers and partial
  // frames, the recalibration moments filed, the layer names each BN
  // stream keeps, and the state copies of ReadState calls (a shard's
  // state three times while a call builds its answer, once while it
  // streams); gauge bnps_server_bn_buffered_bytes. A ReadState of a shard
  // whose state does not fit is refused: exporting a shard of S bytes
  // needs a budget above 3 S.
  int64_t bn_memory_budget_bytes = int64_t{256} << 20;
  // A BN frame begun must be whole within this.
  absl::Duration bn_frame_timeout = absl::Seconds(10);
};

class RunningServer {
 public:
  // Binds `address` ("127.0.0.1:0" picks a free port). INVALID_ARGUMENT for bad
  // options or token; UNAVAILABLE, naming the address, if it cannot be bound:
  // a port already in use is an error (never shared, as gRPC's default
  // SO_REUSEPORT would), so two servers cannot mix two jobs' traffic.
  static absl::StatusOr<std::unique_ptr<RunningServer>> Start(
      ShardOptions options, const std::string& address,
      ServerSecurity security = {}, ServerMonitoring monitoring = {},
      ServerLatency latency = {}, ServerLimits limits = {});
  ~RunningServer();  // Shutdown()

  int port() const { return port_; }
  Shard& shard() { return *shard_; }
  // The server's metrics; registry() outlives metrics() and both live as
  // long as the server. metrics() is null when monitoring.metrics is false.
  metrics::Registry& registry() { return *registry_; }
  ServerMetrics* metrics() { return metrics_.get(); }
  // The server's memory budget (ServerLimits::bn_memory_budget_bytes) and
  // what is charged to it.
  const util::ByteBudget& bn_memory() const { return *bn_budget_; }
  // The raw-TCP BN listener (ServerLatency::bn_port); null when it is off.
  const BnSocketServer* bn_socket_server() const { return bn_socket_.get(); }
  // Stops the raw-TCP BN listener, if any: its connections end, and the
  // workers go on over the gRPC stream.
  void StopBnSocketServer() {
    if (bn_socket_ != nullptr) bn_socket_->Stop();
  }
  // The keeper of ServerLatency::keep_awake; null when it is off.
  const util::KeepAwake* keep_awake() const { return keep_awake_.get(); }

  // The health status of the server and of its ParameterServer service:
  // true SERVING, false NOT_SERVING. For a server that is not ready to
  // serve yet although it listens (e.g. while it restores a checkpoint).
  void SetServing(bool serving);

  // Blocks until Shutdown.
  void Wait();
  // Stops accepting calls, fails everything that still waits, and gives open
  // streams `grace` to end before they are cancelled.
  void Shutdown(absl::Duration grace = absl::Milliseconds(500));

 private:
  RunningServer() = default;
  // Starts bn_socket_ (ServerLatency::bn_port) on the host of `address`.
  // REQUIRES: shard_, metrics_, keep_awake_ and bn_budget_ are set.
  absl::Status StartBnSocketServer(const std::string& address,
                                   const ServerSecurity& security,
                                   const ServerLatency& latency,
                                   const ServerLimits& limits);

  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<util::KeepAwake> keep_awake_;  // outlives service_
  std::shared_ptr<util::ByteBudget> bn_budget_;
  std::unique_ptr<BnSocketServer> bn_socket_;
  std::unique_ptr<ShardService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_SERVER_RUNNER_H_
