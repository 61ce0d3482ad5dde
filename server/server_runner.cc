#include "server/server_runner.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"
#include "security/job_token.h"
#include "proto/limits.h"
#include "server/shard_service.h"

namespace bnps::server {

namespace {

// The checks of ServerLatency and ServerLimits.
absl::Status CheckLatencyAndLimits(const ServerLatency& latency,
                                   const ServerLimits& limits) {
  if (latency.keep_awake < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("keep_awake must be >= 0");
  }
  if (latency.bn_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bn_port ", latency.bn_port, " is not a port"));
  }
  if (!latency.bn_unix_path.empty() && latency.bn_port < 0) {
    return absl::InvalidArgumentError(
        "a BN Unix socket (bn_unix_path, bnps_server --bn_unix_socket) "
        "needs the raw-TCP BN listener (bn_port >= 0, --bn_port): TCP is "
        "what workers on other hosts, and any that cannot connect to the "
        "path, use");
  }
  if (limits.bn_max_connections < 0 || limits.bn_memory_budget_bytes <= 0 ||
      limits.bn_frame_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "bn_max_connections must be >= 0, bn_memory_budget_bytes and "
        "bn_frame_timeout > 0");
  }
  return absl::OkStatus();
}

// The gauge of what the BN connections hold.
void AddBudgetGauge(metrics::Registry* registry,
                    std::shared_ptr<util::ByteBudget> bn_budget) {
  metrics::Gauge* held =
      registry
          ->AddGauge("bnps_server_bn_buffered_bytes",
                     "Bytes the BN connections (raw TCP and BnSync "
                     "streams) hold: answers not read yet and frames partly "
                     "received; at most --bn_memory_budget_mb.")
          ->WithLabels({});
  registry->AddCollector([held, bn_budget] {
    held->Set(static_cast<double>(bn_budget->used()));
  });
}

}  // namespace

absl::Status RunningServer::StartBnSocketServer(
    const std::string& address, const ServerSecurity& security,
    const ServerLatency& latency, const ServerLimits& limits) {
  if (security.credentials != nullptr) {
    return absl::InvalidArgumentError(
        "the raw-TCP BN listener (bn_port) is plaintext: it cannot serve a "
        "job that uses TLS");
  }
  BnSocketServer::Options bo;
  bo.host = address.substr(0, address.rfind(':'));
  bo.port = latency.bn_port;
  bo.token = security.token;
  bo.per_worker_tokens = security.per_worker_tokens;
  bo.max_connections = limits.bn_max_connections;
  bo.max_unauthenticated_per_peer = limits.bn_max_unauthenticated_per_peer;
  bo.budget = bn_budget_;
  bo.frame_timeout = limits.bn_frame_timeout;
  bo.unix_path = latency.bn_unix_path;
  bo.busy_poll = latency.keep_awake;
  absl::StatusOr<std::unique_ptr<BnSocketServer>> bn = BnSocketServer::Start(
      shard_.get(), metrics_.get(), keep_awake_.get(), std::move(bo));
  if (!bn.ok()) return bn.status();
  bn_socket_ = *std::move(bn);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RunningServer>> RunningServer::Start(
    ShardOptions options, const std::string& address,
    ServerSecurity security, ServerMonitoring monitoring,
    ServerLatency latency, ServerLimits limits) {
  if (!security.token.empty()) {
    if (absl::Status s = security::ValidateToken(security.token); !s.ok()) {
      return s;
    }
  }
  if (security.per_worker_tokens && security.token.empty()) {
    return absl::InvalidArgumentError(
        "per-worker tokens are derived from the job token: give one");
  }
  options.seal_key = security.token;  // seals the loss news it lists
  if (absl::Status s = CheckLatencyAndLimits(latency, limits); !s.ok()) {
    return s;
  }
  // The server's one memory budget: the BN answers and frames of both
  // transports, the recalibration moments, the layer names the BN streams
  // keep, and the state copies of ReadState.
  auto bn_budget =
      std::make_shared<util::ByteBudget>(limits.bn_memory_budget_bytes);
  options.memory_budget = bn_budget;
  absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(std::move(options));
  if (!shard.ok()) return shard.status();
  std::unique_ptr<RunningServer> rs(new RunningServer());
  rs->shard_ = *std::move(shard);
  rs->registry_ = std::make_unique<metrics::Registry>();
  if (monitoring.metrics) {
    rs->metrics_ =
        std::make_unique<ServerMetrics>(rs->registry_.get(), rs->shard_.get());
  }
  if (latency.keep_awake > absl::ZeroDuration()) {
    absl::StatusOr<std::unique_ptr<util::KeepAwake>> k =
        util::KeepAwake::Start(latency.keep_awake);
    if (!k.ok()) return k.status();
    rs->keep_awake_ = *std::move(k);
  }
  rs->bn_budget_ = bn_budget;
  if (rs->metrics_ != nullptr) AddBudgetGauge(rs->registry_.get(), bn_budget);
  if (latency.bn_port >= 0) {
    if (absl::Status s =
            rs->StartBnSocketServer(address, security, latency, limits);
        !s.ok()) {
      return s;
    }
  }
  rs->service_ = std::make_unique<ShardService>(
      rs->shard_.get(), std::move(security.token), rs->metrics_.get(),
      rs->keep_awake_.get(), rs->bn_socket_.get(), security.per_worker_tokens,
      bn_budget);
  // Both are process-wide switches of gRPC, read when a builder is made;
  // turning them on again is harmless.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address,
                           security.credentials != nullptr
                               ? security.credentials
                               : grpc::InsecureServerCredentials(),
                           &rs->port_);
  // gRPC binds with SO_REUSEPORT by default, so a second server on a port in
  // use would start and the kernel would split the clients between the two:
  // two jobs silently mixing their traffic. A busy port must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(rs->service_.get());
  builder.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(proto::kMaxMessageBytes);
  rs->server_ = builder.BuildAndStart();
  if (rs->server_ == nullptr || rs->port_ == 0) {
    // gRPC says why only in its log: a port in use (by any process, another
    // bnps_server included), an address not of this machine, or (with TLS) a
    // certificate and key that do not match.
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address,
        security.credentials != nullptr
            ? " (address in use or not local, or a TLS certificate and key "
              "that do not match: see gRPC's log above)"
            : " (address in use or not local)"));
  }
  rs->SetServing(true);
  return rs;
}

void RunningServer::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health =
      server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(serving);  // every service, and ""
  health->SetServingStatus(proto::ParameterServer::service_full_name(),
                           serving);
}

RunningServer::~RunningServer() { Shutdown(); }

void RunningServer::Wait() {
  if (server_) server_->Wait();
}

void RunningServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_ || server_ == nullptr) return;
    shut_down_ = true;
  }
  // BN over TCP stops first: its clients then see their connections end
  // (and go on over gRPC while it drains).
  if (bn_socket_ != nullptr) bn_socket_->Stop();
  // Calls still waiting on barriers must end for the server to stop: fail them
  // repeatedly while gRPC drains, since new ones may arrive meanwhile.
  absl::Notification stopped;
  std::thread expirer([this, &stopped] {
    do {
      shard_->ExpireAllWaits();
    } while (!stopped.WaitForNotificationWithTimeout(absl::Milliseconds(10)));
  });
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  stopped.Notify();
  expirer.join();
}

}  // namespace bnps::server
