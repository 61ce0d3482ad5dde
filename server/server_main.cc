#include "server/server_main.h"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "metrics/http_endpoint.h"
#include "metrics/metrics_flags.h"
#include "policy/policy.h"
#include "server/bn_socket_server.h"
#include "server/server_runner.h"
#include "util/command_line.h"
#include "util/fd_limit.h"
#include "util/heap_flags.h"

namespace bnps::server {
namespace {

// The signals the server's signal thread takes: SIGINT and SIGTERM stop
// it; SIGUSR1 is how the end of the job wakes that thread.
sigset_t ServerSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}

int Fail(const absl::Status& s, int exit_code) {
  std::fprintf(stderr, "bnps_server: %s\n", std::string(s.message()).c_str());
  return exit_code;
}

// The lines that say where the server listens; the launcher reads the
// port from the end of the first.
void PrintListening(const ServerOptions& o, const RunningServer& server,
                    const metrics::HttpEndpoint* metrics) {
  const policy::JobPolicy policy{
      o.shard.policy, o.shard.gradients.value_or(
                          policy::ShorthandGradients(o.shard.policy))};
  std::printf("bnps_server: shard %d of %d, job '%s', policy %s, %d workers, "
              "%s%s, listening on %s:%d\n",
              o.shard.shard, o.shard.num_shards, o.shard.job.c_str(),
              policy::JobPolicyName(policy).c_str(), o.shard.num_workers,
              o.transport.c_str(),
              o.security.token.empty()       ? ""
              : o.security.per_worker_tokens ? " with per-worker tokens"
                                             : " with a job token",
              o.host.c_str(), server.port());
  const BnSocketServer* bn = server.bn_socket_server();
  const int cap = BnSocketServer::ConnectionCap(util::OpenFileLimit());
  if (bn != nullptr && bn->max_connections() + bn->max_unauthenticated() > cap) {
    std::fprintf(stderr,
                 "bnps_server: warning: --bn_max_connections=%d (and %d "
                 "before their hello) is more than "
                 "the descriptor limit leaves room for (%d): a flood of BN "
                 "connections can use every descriptor, and gRPC's listener "
                 "does not accept again after that\n",
                 bn->max_connections(), bn->max_unauthenticated(), cap);
  }
  if (bn != nullptr) {
    std::printf("bnps_server: BN over TCP at %s:%d (at most %d connections, "
                "%d more before their hello, of %lld descriptors)\n",
                o.host.c_str(), bn->port(), bn->max_connections(),
                bn->max_unauthenticated(),
                static_cast<long long>(util::OpenFileLimit()));
    if (!bn->unix_path().empty()) {
      std::printf("bnps_server: BN over a Unix socket at %s\n",
                  bn->unix_path().c_str());
    }
  }
  if (metrics != nullptr) {
    std::printf("bnps_server: metrics at http://%s:%d/metrics\n",
                metrics::MetricsAddress().c_str(), metrics->port());
  }
  std::fflush(stdout);
}

// The signal thread: waits for SIGINT or SIGTERM, or for the SIGUSR1 that
// says the job ended (`ended`: 1 complete, 2 its final checkpoint failed),
// and shuts the server down.
void ServeSignals(const sigset_t& set, RunningServer* server,
                  const std::atomic<int>& ended) {
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
    server->Shutdown();
    return;
  }
  std::fprintf(stderr, "bnps_server: signal %d, shutting down\n", sig);
  if (sig == SIGTERM && !server->shard().options().checkpoint_dir.empty()) {
    // Under sync the checkpoints taken at step boundaries are flushed (a
    // mid-step state is not consistent across shards); under async the
    // state now is written as well.
    const absl::Status s = server->shard().CheckpointNow();
    std::fprintf(stderr, "bnps_server: checkpoint at SIGTERM: %s\n",
                 s.ok() ? "written" : std::string(s.message()).c_str());
  }
  server->Shutdown();
}

}  // namespace

absl::Status PrepareServerProcess() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::Status s = util::ApplyHeapFlag(); !s.ok()) return s;
  // The soft descriptor limit (often 1,024) up to the hard one, before
  // any thread opens descriptors; the BN connection cap is derived from it.
  absl::StatusOr<int64_t> open_files = util::RaiseOpenFileLimit();
  if (!open_files.ok()) {
    std::fprintf(stderr, "bnps_server: %s (going on with %lld)\n",
                 std::string(open_files.status().message()).c_str(),
                 static_cast<long long>(util::OpenFileLimit()));
  }
  // Blocked before any thread starts (threads inherit the mask) and taken
  // by one thread, which shuts the server down cleanly.
  const sigset_t set = ServerSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return absl::OkStatus();
}

int RunServer(const ServerOptions& options) {
  ShardOptions shard = options.shard;
  if (shard.membership.has_value()) {
    std::fprintf(stderr, "bnps_server: membership %s (FROM_STEP:WORKERS)\n",
                 shard.membership->ToString().c_str());
  }
  // The end of the job: 0 while it runs, 1 complete, 2 its final
  // checkpoint failed. Without keep_serving the signal thread then
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
  const bool keep_serving = options.keep_serving;
  shard.on_job_complete = [&](const absl::Status& final_checkpoint) {
    ended.store(final_checkpoint.ok() ? 1 : 2);
    if (keep_serving) {
      std::fprintf(stderr,
                   "bnps_server: the job is complete; serving its final "
                   "state for reads (--keep_serving) until stopped\n");
      return;
    }
    wake();
  };
  absl::StatusOr<std::unique_ptr<RunningServer>> server = RunningServer::Start(
      std::move(shard), absl::StrCat(options.host, ":", options.port),
      options.security, {}, options.latency, options.limits);
  // Options that do not fit together (RunningServer::Start checks them:
  // --bn_unix_socket without --bn_port, ...) are bad flags.
  if (!server.ok()) {
    return Fail(server.status(),
                server.status().code() == absl::StatusCode::kInvalidArgument
                    ? util::kBadFlagsExitCode
                    : 1);
  }
  absl::StatusOr<std::unique_ptr<metrics::HttpEndpoint>> metrics =
      metrics::StartEndpointFromFlags(&(*server)->registry());
  if (!metrics.ok()) return Fail(metrics.status(), 1);
  PrintListening(options, **server, metrics->get());

  const sigset_t set = ServerSignals();
  std::thread signals([&set, &server, &ended] {
    ServeSignals(set, server->get(), ended);
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

}  // namespace bnps::server
