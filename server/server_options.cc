#include "server/server_options.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "metrics/metrics_flags.h"
#include "policy/job_flags.h"
#include "policy/policy.h"
#include "proto/membership_history.h"
#include "security/credentials.h"
#include "security/job_token.h"

ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address to listen on. 127.0.0.1 serves this machine only; 0.0.0.0 "
          "serves every interface (in a container or a cluster).");
ABSL_FLAG(int, port, 7000, "Port to listen on; 0 picks a free one (printed).");
ABSL_FLAG(int, shard, 0, "This server's shard id, in [0, num_shards).");
ABSL_FLAG(int, num_shards, 1, "Number of shard servers in the job.");
ABSL_FLAG(double, bn_momentum, 0.1,
          "Momentum of the BN running statistics (as PyTorch's); workers "
          "take it from the servers for their own copies.");
ABSL_FLAG(int64_t, barrier_timeout_ms, 60000,
          "How long a step may wait for the other workers (BN barriers, "
          "parameter versions, clocks) before it fails with DEADLINE_EXCEEDED "
          "naming the workers it waited for.");
ABSL_FLAG(int64_t, heartbeat_timeout_ms, 10000,
          "A registered worker silent this long is lost; see --on_worker_loss.");
ABSL_FLAG(std::string, on_worker_loss, "fail",
          "What a lost worker means: fail (steps that need it fail with "
          "FAILED_PRECONDITION naming it, so the job stops with a clear error) or "
          "shrink (it is dropped and the job goes on with the others) or wait "
          "(steps wait for it up to --barrier_timeout_ms; a process restarted "
          "with its id takes its place and the job rolls back to the last "
          "checkpoint, see --checkpoint_dir). Default fail: without a "
          "supervisor that restarts workers, waiting only delays the error.");
ABSL_FLAG(std::string, membership, "",
          "A sync job resized while it runs: how many workers train from "
          "which step on, as FROM_STEP:W segments, e.g. 0:2,100:4,200:2 (the "
          "workers of step s are ids 0..W-1; --num_workers is the job's ids, "
          "at least the largest W). Every server and worker of the job gets "
          "the same value. Restarted from a checkpoint of step N, the servers "
          "take a --membership that agrees with the checkpoint's before N and "
          "may start a new count at N. Empty: --num_workers at every step.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Directory of this server's checkpoints (one per shard; created if "
          "absent). Started with one that holds a checkpoint, the server "
          "resumes from the newest good one and the workers roll the job "
          "back to a step every server has. Empty: no checkpoints.");
ABSL_FLAG(int64_t, checkpoint_every_steps, 0,
          "With --checkpoint_dir: a checkpoint every this many steps (at the "
          "step boundary every shard passes under sync, recal and local), "
          "keeping the last 3. 0: only at SIGTERM (async) or never (the "
          "bulk-synchronous policies, which checkpoint only at boundaries).");


ABSL_FLAG(std::string, token_file, "",
          "File holding the job's token (16 to 4096 printable characters, no "
          "spaces; e.g. `openssl rand -hex 32 > token`). Every call must prove "
          "it (workers: --token_file) or is refused with UNAUTHENTICATED. "
          "Without TLS the token never crosses the wire (calls run under "
          "sessions), but what they carry can be read: use with TLS outside "
          "a trusted network.");
ABSL_FLAG(bool, per_worker_tokens, false,
          "With --token_file: each worker may carry a token of its own, "
          "derived from the job token (bnps_worker_token --token_file=JOB "
          "--worker=N), which acts as that worker alone, over gRPC and the "
          "raw-TCP BN connection, with one live BN connection per worker. "
          "The job token itself still acts as any worker: keep it with the "
          "servers and the operator, and give each worker only its own.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain to serve TLS with (needs --tls_key). Without "
          "it, calls are plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificates: with --tls_cert, a client must present a "
          "certificate that chains to one of them (mutual TLS).");
ABSL_FLAG(int64_t, keep_awake_us, 0,
          "Above 0: after each call and each BN message, keep the CPUs this "
          "process may run on busy at idle priority (SCHED_IDLE) for this "
          "many microseconds, and the raw-TCP BN listener polling its "
          "connections rather than sleeping, so the next message is "
          "answered without waking a CPU from idle (tens of microseconds "
          "on a VM) or a thread. For a "
          "server with CPUs of its own (taskset, a container's cpuset): "
          "e.g. 2000. 0: off.");
ABSL_FLAG(bool, keep_serving, false,
          "Keep serving after the job is complete (every worker finished "
          "and left). Default false: the server then writes its final "
          "checkpoint (with --checkpoint_dir), says so, and exits 0. With "
          "it, the server goes on answering reads (bnps_status, --digest, "
          "--export) until SIGTERM. A server started on a complete job (from "
          "its final checkpoint) always keeps serving reads: that is how an "
          "export stays possible after the job.");
ABSL_FLAG(int, bn_port, -1,
          "Also serve BN traffic over raw TCP on this port of --host (0: a "
          "free one), which registering workers are told: faster per "
          "exchange than the gRPC stream. Plaintext jobs only "
          "(not with --tls_cert). -1: off.");
ABSL_FLAG(std::string, bn_unix_socket, "",
          "With --bn_port: also serve BN traffic on a Unix stream socket at "
          "this path, which registering workers are told; a worker on this "
          "host connects there first (cheaper than loopback TCP) and falls "
          "back to --bn_port. \"auto\": $XDG_RUNTIME_DIR/bnps-bn-<pid>-"
          "<port>.sock (or /tmp/...). The socket is made 0600 and removed "
          "on a clean stop; a stale socket at the path is replaced, anything "
          "else refused. Plaintext jobs only. Empty: none.");
ABSL_FLAG(int, bn_max_connections, 0,
          "With --bn_port: most BN connections past their hello at once; a "
          "hello past it is refused (its worker uses the gRPC stream). "
          "Connections before their hello have a cap of their own (an "
          "eighth of this, 16 to 1,024; 64 from one address). 0: both out "
          "of half of the descriptors left after 64 for the server itself, "
          "the other half kept for gRPC's connections (the server raises its "
          "soft descriptor limit to the hard one at start).");
ABSL_FLAG(int, bn_max_unauthenticated_per_peer, 64,
          "With --bn_port: most BN connections before their hello from one "
          "address; more are closed on arrival. At least 1.");
ABSL_FLAG(int64_t, bn_memory_budget_mb, 256,
          "MiB that all BN connections together (raw TCP and gRPC BnSync "
          "streams) may hold in answers their clients have not read and "
          "frames partly received. Past it a connection is cut off or shed, "
          "and a request whose answer would not fit is answered with "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, bn_frame_timeout_ms, 10000,
          "With --bn_port: a BN frame begun must be whole within this, or "
          "its connection is closed.");

namespace bnps::server {
namespace {

// The job's settings: its shape, policy, optimizer, timeouts, checkpoints.
absl::StatusOr<ShardOptions> ShardOptionsFromFlags() {
  ShardOptions o;
  o.job = absl::GetFlag(FLAGS_job);
  o.shard = absl::GetFlag(FLAGS_shard);
  o.num_shards = absl::GetFlag(FLAGS_num_shards);
  o.num_workers = absl::GetFlag(FLAGS_num_workers);
  if (const std::string m = absl::GetFlag(FLAGS_membership); !m.empty()) {
    absl::StatusOr<proto::MembershipHistory> h =
        proto::MembershipHistory::Parse(m);
    if (!h.ok()) return h.status();
    o.membership = *std::move(h);
  }
  absl::StatusOr<policy::JobPolicy> policy = policy::ResolvePolicy(
      absl::GetFlag(FLAGS_policy), absl::GetFlag(FLAGS_bn_policy),
      absl::GetFlag(FLAGS_gradients));
  if (!policy.ok()) return policy.status();
  o.policy = policy->bn;
  o.gradients = policy->gradients;
  absl::StatusOr<policy::WorkerLoss> loss =
      policy::ParseWorkerLoss(absl::GetFlag(FLAGS_on_worker_loss));
  if (!loss.ok()) return loss.status();
  o.worker_loss = *loss;
  o.staleness = absl::GetFlag(FLAGS_staleness).value_or(policy::kDefaultStaleness);
  o.bn_group_size = absl::GetFlag(FLAGS_bn_group_size).value_or(0);
  absl::StatusOr<bool> by_host =
      policy::ParseBnGroupByHost(absl::GetFlag(FLAGS_bn_group));
  if (!by_host.ok()) return by_host.status();
  o.bn_group_by_host = *by_host;
  o.bn_staleness = absl::GetFlag(FLAGS_bn_staleness).value_or(-1);
  o.optimizer.learning_rate =
      absl::GetFlag(FLAGS_learning_rate).value_or(policy::kDefaultLearningRate);
  o.optimizer.momentum =
      absl::GetFlag(FLAGS_momentum).value_or(policy::kDefaultMomentum);
  o.optimizer.weight_decay =
      absl::GetFlag(FLAGS_weight_decay).value_or(policy::kDefaultWeightDecay);
  o.bn_momentum = absl::GetFlag(FLAGS_bn_momentum);
  o.barrier_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_barrier_timeout_ms));
  o.heartbeat_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every_steps);
  // After a restart, stale-synchronous workers resume each at its own step,
  // which sync BN's per-step barriers cannot pair up: not supported yet.
  if (!o.checkpoint_dir.empty() && o.policy == policy::Policy::kSync &&
      o.gradients == policy::Gradients::kAsync) {
    return absl::InvalidArgumentError(
        "--checkpoint_dir with --bn_policy=sync and --gradients=async "
        "is not supported: after a restart the workers would resume "
        "at different steps, which sync BN's barriers cannot pair; "
        "use --gradients=sync or run without checkpoints");
  }
  return o;
}

// TLS and tokens; sets `transport` to how the listening line names them.
absl::StatusOr<ServerSecurity> SecurityFromFlags(std::string* transport) {
  ServerSecurity security;
  security::TlsFiles tls;
  tls.cert = absl::GetFlag(FLAGS_tls_cert);
  tls.key = absl::GetFlag(FLAGS_tls_key);
  tls.ca = absl::GetFlag(FLAGS_tls_client_ca);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      security::MakeServerCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  // Null means plaintext to RunningServer, whose errors then do not blame TLS.
  if (security::UsesTls(tls)) security.credentials = *credentials;
  *transport = !security::UsesTls(tls) ? "plaintext"
               : tls.ca.empty()        ? "TLS"
                                       : "mutual TLS";
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = security::ReadTokenFile(path);
    if (!token.ok()) return token.status();
    security.token = *std::move(token);
  }
  security.per_worker_tokens = absl::GetFlag(FLAGS_per_worker_tokens);
  if (security.per_worker_tokens && security.token.empty()) {
    return absl::InvalidArgumentError(
        "--per_worker_tokens derives the workers' tokens from the job "
        "token: give --token_file");
  }
  return security;
}

// --keep_awake_us and the raw-TCP BN listener; `tls`: the job uses TLS.
absl::StatusOr<ServerLatency> LatencyFromFlags(bool tls) {
  const int64_t keep_awake_us = absl::GetFlag(FLAGS_keep_awake_us);
  if (keep_awake_us < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep_awake_us must be >= 0, not ", keep_awake_us));
  }
  ServerLatency latency;
  latency.keep_awake = absl::Microseconds(keep_awake_us);
  latency.bn_port = absl::GetFlag(FLAGS_bn_port);
  if (latency.bn_port < -1 || latency.bn_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bn_port ", latency.bn_port, " is not a port (or -1)"));
  }
  if (latency.bn_port >= 0 && tls) {
    return absl::InvalidArgumentError(
        "--bn_port serves BN traffic in plaintext: it cannot be used "
        "with --tls_cert");
  }
  latency.bn_unix_path = absl::GetFlag(FLAGS_bn_unix_socket);
  return latency;
}

// What the BN connections may hold.
absl::StatusOr<ServerLimits> LimitsFromFlags() {
  ServerLimits limits;
  limits.bn_max_connections = absl::GetFlag(FLAGS_bn_max_connections);
  limits.bn_max_unauthenticated_per_peer =
      absl::GetFlag(FLAGS_bn_max_unauthenticated_per_peer);
  if (limits.bn_max_unauthenticated_per_peer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bn_max_unauthenticated_per_peer must be >= 1, not ",
                     limits.bn_max_unauthenticated_per_peer));
  }
  if (limits.bn_max_connections < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bn_max_connections must be >= 0, not ",
                     limits.bn_max_connections));
  }
  const int64_t budget_mb = absl::GetFlag(FLAGS_bn_memory_budget_mb);
  const int64_t frame_timeout_ms = absl::GetFlag(FLAGS_bn_frame_timeout_ms);
  if (budget_mb <= 0 || budget_mb > (int64_t{1} << 30) ||
      frame_timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bn_memory_budget_mb (", budget_mb, ") and --bn_frame_timeout_ms (",
        frame_timeout_ms, ") must be > 0"));
  }
  limits.bn_memory_budget_bytes = budget_mb << 20;
  limits.bn_frame_timeout = absl::Milliseconds(frame_timeout_ms);
  return limits;
}

}  // namespace

absl::StatusOr<ServerOptions> ServerOptionsFromFlags() {
  ServerOptions o;
  absl::StatusOr<ShardOptions> shard = ShardOptionsFromFlags();
  if (!shard.ok()) return shard.status();
  o.shard = *std::move(shard);
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  if (o.port < 0 || o.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port ", o.port, " is not a port"));
  }
  absl::StatusOr<ServerSecurity> security = SecurityFromFlags(&o.transport);
  if (!security.ok()) return security.status();
  o.security = *std::move(security);
  if (absl::Status m = metrics::CheckMetricsFlags(); !m.ok()) return m;
  absl::StatusOr<ServerLatency> latency =
      LatencyFromFlags(o.security.credentials != nullptr);
  if (!latency.ok()) return latency.status();
  o.latency = *std::move(latency);
  absl::StatusOr<ServerLimits> limits = LimitsFromFlags();
  if (!limits.ok()) return limits.status();
  o.limits = *limits;
  o.keep_serving = absl::GetFlag(FLAGS_keep_serving);
  return o;
}

}  // namespace bnps::server
