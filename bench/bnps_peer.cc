#include "bench/bnps_peer.h"

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bn/moments.h"
#include "server/server_runner.h"

namespace bnps::bench {

client::GrpcClientOptions ClientOptions(std::vector<std::string> servers,
                                      int worker, int workers) {
  client::GrpcClientOptions o;
  o.servers = std::move(servers);
  o.job = "bnps";
  o.worker = worker;
  o.num_workers = workers;
  o.rpc_timeout = absl::Seconds(30);
  return o;
}

absl::StatusOr<std::vector<double>> BnpsWorker(const Job& job,
                                               RowControl* control) {
  client::GrpcClientOptions options = ClientOptions(
      {absl::StrCat("127.0.0.1:", job.port)}, job.rank, job.workers);
  options.bn_spin = absl::Nanoseconds(job.bn_spin_ns);
  auto client = client::GrpcPsClient::Connect(std::move(options));
  if (!client.ok()) {
    control->stop.store(true);
    return client.status();
  }
  bn::Moments local;
  local.count = 32;
  for (int c = 0; c < job.channels; ++c) {
    local.mean.push_back(0.01 * c + job.rank);
    local.m2.push_back(1.0 + c);
  }
  std::vector<double> us;
  CallPlan plan(job, control);
  for (int i = 0; plan.MayStart(i) && KeepGoing(job, control); ++i) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<client::BnForwardResult> result =
        (*client)->BnForward("bn/0", i, local);
    const double elapsed = MicrosSince(t0);
    if (!result.ok() || result->contributors != job.workers) {
      // Another worker stopped first: not this one's error.
      if (control->stop.exchange(true)) break;
      return result.ok() ? absl::InternalError("barrier skipped a worker")
                         : result.status();
    }
    if (i >= job.warmup) us.push_back(elapsed);
    plan.Finished(i);
  }
  return us;
}

absl::StatusOr<Latency> BnpsLatency(WorkerPool& pool, int channels, int workers,
                                    const Settings& s, bool metrics) {
  server::ShardOptions options;
  options.num_workers = workers;
  options.policy = policy::Policy::kSync;
  options.barrier_timeout = absl::Seconds(5);
  server::ServerLatency latency;
  latency.bn_port = s.bn_over_tcp ? 0 : -1;
  absl::StatusOr<std::unique_ptr<server::RunningServer>> server =
      server::RunningServer::Start(options, "127.0.0.1:0", {},
                                   server::ServerMonitoring{metrics}, latency);
  if (!server.ok()) return server.status();
  Job job = RowJob(Peer::kBnps, channels, workers, s);
  job.port = (*server)->port();
  return pool.Run(job);
}

}  // namespace bnps::bench
