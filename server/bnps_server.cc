// bnps_server: one shard server of a bnps job.
//
//   bnps_server --port=7000 --shard=0 --num_shards=2 --num_workers=4 --policy=sync

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "metrics/http_endpoint.h"
#include "metrics/metrics_flags.h"
#include "policy/job_flags.h"
#include "proto/membership_history.h"
#include "security/credentials.h"
#include "security/job_token.h"
#include "server/server_runner.h"
#include "util/command_line.h"
#include "util/fd_limit.h"
#include "util/heap_flags.h"

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
          "spaces; e.g. `openssl rand -hex 32 > token`). Every call must carry "
          "it (workers: --token_file) or is refused with UNAUTHENTICATED. Use "
          "with TLS outside a trusted network: plaintext calls show it.");
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

namespace {

constexpr int kBadFlags = bnps::util::kBadFlagsExitCode;

std::string Fail(const absl::Status& s) {
  std::fprintf(stderr, "bnps_server: %s\n", std::string(s.message()).c_str());
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // --help exits 0; an unknown or malformed flag exits 2. Flags may come
  // from BNPS_* variables; BNPS_SHARD=from-hostname takes a StatefulSet pod's
  // ordinal.
  bnps::util::EnvFlagsOptions env;
  env.ordinal_flag = "shard";
  bnps::util::ParseCommandLine(
      argc, argv,
      "A shard server of a bnps job: keeps the parameters it owns, applies the "
      "optimizer, and merges BN statistics under --policy.\n"
      "  bnps_server --port=7000 --shard=0 --num_shards=2 --num_workers=4 "
      "--policy=sync\n"
      "The server exits 0 once every worker of the job finished and its "
      "final checkpoint is written, unless --keep_serving; restarted on a "
      "complete job, it serves the final state for reads until stopped.\n"
      "Exit status: 0 after the job completed or a clean shutdown (SIGINT, "
      "SIGTERM) or --help; 2 for a flag it cannot use; 1 for options that "
      "do not fit together, an address it cannot bind (a port in use), or a "
      "final checkpoint that could not be written.",
      env);
  // Debian builds Abseil with Mutex deadlock detection on, which records a
  // lock graph at every acquisition; the tests keep it, the binaries do not.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::Status s = bnps::util::ApplyHeapFlag(); !s.ok()) {
    return Fail(s), kBadFlags;
  }
  // The soft descriptor limit (often 1,024) up to the hard one, before
  // any thread opens descriptors; the BN connection cap is derived from it.
  absl::StatusOr<int64_t> open_files = bnps::util::RaiseOpenFileLimit();
  if (!open_files.ok()) {
    std::fprintf(stderr, "bnps_server: %s (going on with %lld)\n",
                 std::string(open_files.status().message()).c_str(),
                 static_cast<long long>(bnps::util::OpenFileLimit()));
  }
  // SIGINT/SIGTERM are blocked before any thread starts (threads inherit the
  // mask) and taken by one thread, which shuts the server down cleanly.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  // SIGUSR1 is how the end of the job wakes the signal thread (below).
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  bnps::server::ShardOptions o;
  o.job = absl::GetFlag(FLAGS_job);
  o.shard = absl::GetFlag(FLAGS_shard);
  o.num_shards = absl::GetFlag(FLAGS_num_shards);
  o.num_workers = absl::GetFlag(FLAGS_num_workers);
  if (const std::string m = absl::GetFlag(FLAGS_membership); !m.empty()) {
    absl::StatusOr<bnps::proto::MembershipHistory> h =
        bnps::proto::MembershipHistory::Parse(m);
    if (!h.ok()) return Fail(h.status()), kBadFlags;
    o.membership = *std::move(h);
    std::fprintf(stderr, "bnps_server: membership %s (FROM_STEP:WORKERS)\n",
                 o.membership->ToString().c_str());
  }
  absl::StatusOr<bnps::policy::JobPolicy> policy = bnps::policy::ResolvePolicy(
      absl::GetFlag(FLAGS_policy), absl::GetFlag(FLAGS_bn_policy),
      absl::GetFlag(FLAGS_gradients));
  if (!policy.ok()) return Fail(policy.status()), kBadFlags;
  o.policy = policy->bn;
  o.gradients = policy->gradients;
  absl::StatusOr<bnps::policy::WorkerLoss> loss =
      bnps::policy::ParseWorkerLoss(absl::GetFlag(FLAGS_on_worker_loss));
  if (!loss.ok()) return Fail(loss.status()), kBadFlags;
  o.worker_loss = *loss;
  o.staleness =
      absl::GetFlag(FLAGS_staleness).value_or(bnps::policy::kDefaultStaleness);
  o.bn_group_size = absl::GetFlag(FLAGS_bn_group_size).value_or(0);
  o.optimizer.learning_rate = absl::GetFlag(FLAGS_learning_rate)
                                  .value_or(bnps::policy::kDefaultLearningRate);
  o.optimizer.momentum =
      absl::GetFlag(FLAGS_momentum).value_or(bnps::policy::kDefaultMomentum);
  o.optimizer.weight_decay = absl::GetFlag(FLAGS_weight_decay)
                                 .value_or(bnps::policy::kDefaultWeightDecay);
  o.bn_momentum = absl::GetFlag(FLAGS_bn_momentum);
  o.barrier_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_barrier_timeout_ms));
  o.heartbeat_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every_steps);
  // The end of the job: 0 while it runs, 1 complete, 2 its final
  // checkpoint failed. Without --keep_serving the signal thread then
  // shuts the server down (not this callback: it runs on a call's thread,
  // which Shutdown would wait for).
  std::atomic<int> ended{0};
  std::atomic<pthread_t> signal_thread{};
  std::atomic<bool> signal_thread_set{false};
  std::atomic<bool> woken{false};  // SIGUSR1 sent once, by whoever is last
  const auto wake = [&] {
    if (signal_thread_set.load() && !woken.exchange(true)) {
      pthread_kill(signal_thread.load(), SIGUSR1);
    }
  };
  const bool keep_serving = absl::GetFlag(FLAGS_keep_serving);
  o.on_job_complete = [&](const absl::Status& final_checkpoint) {
    ended.store(final_checkpoint.ok() ? 1 : 2);
    if (keep_serving) {
      std::fprintf(stderr,
                   "bnps_server: the job is complete; serving its final "
                   "state for reads (--keep_serving) until stopped\n");
      return;
    }
    wake();
  };
  // After a restart, stale-synchronous workers resume each at its own step,
  // which sync BN's per-step barriers cannot pair up: not supported yet.
  if (!o.checkpoint_dir.empty() && o.policy == bnps::policy::Policy::kSync &&
      o.gradients == bnps::policy::Gradients::kAsync) {
    return Fail(absl::InvalidArgumentError(
               "--checkpoint_dir with --bn_policy=sync and --gradients=async "
               "is not supported: after a restart the workers would resume "
               "at different steps, which sync BN's barriers cannot pair; "
               "use --gradients=sync or run without checkpoints")),
           kBadFlags;
  }
  const int port = absl::GetFlag(FLAGS_port);
  if (port < 0 || port > 65535) {
    return Fail(absl::InvalidArgumentError(
               absl::StrCat("--port ", port, " is not a port"))),
           kBadFlags;
  }
  bnps::server::ServerSecurity security;
  bnps::security::TlsFiles tls;
  tls.cert = absl::GetFlag(FLAGS_tls_cert);
  tls.key = absl::GetFlag(FLAGS_tls_key);
  tls.ca = absl::GetFlag(FLAGS_tls_client_ca);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      bnps::security::MakeServerCredentials(tls);
  if (!credentials.ok()) return Fail(credentials.status()), kBadFlags;
  // Null means plaintext to RunningServer, whose errors then do not blame TLS.
  if (bnps::security::UsesTls(tls)) security.credentials = *credentials;
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = bnps::security::ReadTokenFile(path);
    if (!token.ok()) return Fail(token.status()), kBadFlags;
    security.token = *std::move(token);
  }
  security.per_worker_tokens = absl::GetFlag(FLAGS_per_worker_tokens);
  if (security.per_worker_tokens && security.token.empty()) {
    return Fail(absl::InvalidArgumentError(
               "--per_worker_tokens derives the workers' tokens from the job "
               "token: give --token_file")),
           kBadFlags;
  }
  if (absl::Status m = bnps::metrics::CheckMetricsFlags(); !m.ok()) {
    return Fail(m), kBadFlags;
  }
  const int64_t keep_awake_us = absl::GetFlag(FLAGS_keep_awake_us);
  if (keep_awake_us < 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
               "--keep_awake_us must be >= 0, not ", keep_awake_us))),
           kBadFlags;
  }
  bnps::server::ServerLatency latency;
  latency.keep_awake = absl::Microseconds(keep_awake_us);
  latency.bn_port = absl::GetFlag(FLAGS_bn_port);
  if (latency.bn_port < -1 || latency.bn_port > 65535) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
               "--bn_port ", latency.bn_port, " is not a port (or -1)"))),
           kBadFlags;
  }
  if (latency.bn_port >= 0 && bnps::security::UsesTls(tls)) {
    return Fail(absl::InvalidArgumentError(
               "--bn_port serves BN traffic in plaintext: it cannot be used "
               "with --tls_cert")),
           kBadFlags;
  }
  latency.bn_unix_path = absl::GetFlag(FLAGS_bn_unix_socket);
  bnps::server::ServerLimits limits;
  limits.bn_max_connections = absl::GetFlag(FLAGS_bn_max_connections);
  limits.bn_max_unauthenticated_per_peer =
      absl::GetFlag(FLAGS_bn_max_unauthenticated_per_peer);
  if (limits.bn_max_unauthenticated_per_peer < 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
               "--bn_max_unauthenticated_per_peer must be >= 1, not ",
               limits.bn_max_unauthenticated_per_peer))),
           kBadFlags;
  }
  if (limits.bn_max_connections < 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
               "--bn_max_connections must be >= 0, not ",
               limits.bn_max_connections))),
           kBadFlags;
  }
  const int64_t budget_mb = absl::GetFlag(FLAGS_bn_memory_budget_mb);
  const int64_t frame_timeout_ms = absl::GetFlag(FLAGS_bn_frame_timeout_ms);
  if (budget_mb <= 0 || budget_mb > (int64_t{1} << 30) ||
      frame_timeout_ms <= 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
               "--bn_memory_budget_mb (", budget_mb,
               ") and --bn_frame_timeout_ms (", frame_timeout_ms,
               ") must be > 0"))),
           kBadFlags;
  }
  limits.bn_memory_budget_bytes = budget_mb << 20;
  limits.bn_frame_timeout = absl::Milliseconds(frame_timeout_ms);
  const std::string address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", port);
  absl::StatusOr<std::unique_ptr<bnps::server::RunningServer>> server =
      bnps::server::RunningServer::Start(o, address, security, {}, latency,
                                         limits);
  // Options that do not fit together (RunningServer::Start checks them:
  // --bn_unix_socket without --bn_port, ...) are bad flags.
  if (!server.ok()) {
    return Fail(server.status()),
           server.status().code() == absl::StatusCode::kInvalidArgument
               ? kBadFlags
               : 1;
  }
  absl::StatusOr<std::unique_ptr<bnps::metrics::HttpEndpoint>> metrics =
      bnps::metrics::StartEndpointFromFlags(&(*server)->registry());
  if (!metrics.ok()) return Fail(metrics.status()), 1;
  // The launcher reads the port from the end of this line.
  std::printf("bnps_server: shard %d of %d, job '%s', policy %s, %d workers, "
              "%s%s, listening on %s:%d\n",
              o.shard, o.num_shards, o.job.c_str(),
              bnps::policy::JobPolicyName(*policy).c_str(), o.num_workers,
              !bnps::security::UsesTls(tls) ? "plaintext"
              : tls.ca.empty()           ? "TLS"
                                         : "mutual TLS",
              security.token.empty()       ? ""
              : security.per_worker_tokens ? " with per-worker tokens"
                                           : " with a job token",
              absl::GetFlag(FLAGS_host).c_str(), (*server)->port());
  if (const auto* bn = (*server)->bn_socket_server();
      bn != nullptr && bn->max_connections() + bn->max_unauthenticated() >
          bnps::server::BnSocketServer::ConnectionCap(
              bnps::util::OpenFileLimit())) {
    std::fprintf(stderr,
                 "bnps_server: warning: --bn_max_connections=%d (and %d "
                 "before their hello) is more than "
                 "the descriptor limit leaves room for (%d): a flood of BN "
                 "connections can use every descriptor, and gRPC's listener "
                 "does not accept again after that\n",
                 bn->max_connections(), bn->max_unauthenticated(),
                 bnps::server::BnSocketServer::ConnectionCap(
                     bnps::util::OpenFileLimit()));
  }
  if (const auto* bn = (*server)->bn_socket_server(); bn != nullptr) {
    std::printf("bnps_server: BN over TCP at %s:%d (at most %d connections, "
                "%d more before their hello, of %lld descriptors)\n",
                absl::GetFlag(FLAGS_host).c_str(), bn->port(),
                bn->max_connections(), bn->max_unauthenticated(),
                static_cast<long long>(bnps::util::OpenFileLimit()));
    if (!bn->unix_path().empty()) {
      std::printf("bnps_server: BN over a Unix socket at %s\n",
                  bn->unix_path().c_str());
    }
  }
  if (*metrics != nullptr) {
    std::printf("bnps_server: metrics at http://%s:%d/metrics\n",
                bnps::metrics::MetricsAddress().c_str(), (*metrics)->port());
  }
  std::fflush(stdout);

  std::thread signals([&set, &server, &ended] {
    int sig = 0;
    // A SIGUSR1 from outside, before the job ended, is not ours.
    while (sigwait(&set, &sig) == 0 && sig == SIGUSR1 && ended.load() == 0) {
    }
    if (sig == SIGUSR1) {
      std::fprintf(stderr,
                   ended.load() == 1
                       ? "bnps_server: every worker finished and the final "
                         "checkpoint is written (if any): exiting "
                         "(--keep_serving would keep serving reads)\n"
                       : "bnps_server: every worker finished but the final "
                         "checkpoint failed: exiting with status 1\n");
      (*server)->Shutdown();
      return;
    }
    std::fprintf(stderr, "bnps_server: signal %d, shutting down\n", sig);
    if (sig == SIGTERM && !(*server)->shard().options().checkpoint_dir.empty()) {
      // Under sync the checkpoints taken at step boundaries are flushed (a
      // mid-step state is not consistent across shards); under async the
      // state now is written as well.
      const absl::Status s = (*server)->shard().CheckpointNow();
      std::fprintf(stderr, "bnps_server: checkpoint at SIGTERM: %s\n",
                   s.ok() ? "written" : std::string(s.message()).c_str());
    }
    (*server)->Shutdown();
  });
  signal_thread.store(signals.native_handle());
  signal_thread_set.store(true);
  // The job may have completed before the thread was known.
  if (ended.load() != 0 && !keep_serving) wake();
  (*server)->Wait();
  signals.join();
  if (*metrics != nullptr) (*metrics)->Stop();
  return ended.load() == 2 && !keep_serving ? 1 : 0;
}
