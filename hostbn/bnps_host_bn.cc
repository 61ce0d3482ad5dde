// bnps_host_bn: a host's BN aggregator (hostbn/aggregator.h). Run one per
// host; start the host's workers with --bn_host_aggregator=ADDRESS:PORT.
// Their BN traffic then crosses to each shard as one frame per layer,
// phase and step for all of them, with the same results.
//
//   bnps_host_bn --host=10.0.0.5 --port=7200 --workers=4 [--token_file=F]

#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "hostbn/aggregator.h"
#include "hostbn/aggregator_metrics.h"
#include "metrics/metrics_flags.h"
#include "metrics/registry.h"
#include "security/job_token.h"
#include "util/command_line.h"

ABSL_FLAG(std::string, host, "127.0.0.1",
          "The address to listen on (IPv4): the host's, or 127.0.0.1 when "
          "its workers reach it there.");
ABSL_FLAG(int, port, 7200, "The port to listen on; 0 picks a free one "
          "(printed).");
ABSL_FLAG(int, workers, 1,
          "The workers on this host (the aggregator waits for all of them "
          "in every BN round).");
ABSL_FLAG(std::string, token_file, "",
          "The job's token, as the servers' --token_file: workers must "
          "carry it (or, with --per_worker_tokens, their own), and the "
          "aggregator shows it to the shards.");
ABSL_FLAG(bool, per_worker_tokens, false,
          "With --token_file: accept each worker's own token "
          "(security/worker_token.h); needs --num_workers.");
ABSL_FLAG(int, num_workers, 0, "The job's workers (for --per_worker_tokens).");
ABSL_FLAG(std::vector<std::string>, shards, {},
          "The shards the aggregator may connect to, comma-separated: the "
          "servers' hosts (any BN port there) or their BN addresses "
          "host:port. A worker's hello naming another is refused, so the "
          "aggregator relays to no address a worker chooses. Empty: any "
          "(with --token_file a shard must still prove the job token before "
          "it gets anything but the hello).");

int main(int argc, char** argv) {
  bnps::util::ParseCommandLine(
      argc, argv,
      "A host's BN aggregator: the BN traffic of the host's workers "
      "(bnps_worker --bn_host_aggregator) crosses to each shard as one frame "
      "per layer, phase and step.\n  usage: bnps_host_bn --host=ADDRESS "
      "--port=PORT --workers=K [--token_file=FILE]");
  bnps::hostbn::Aggregator::Options o;
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  o.workers = absl::GetFlag(FLAGS_workers);
  o.per_worker_tokens = absl::GetFlag(FLAGS_per_worker_tokens);
  o.num_workers = absl::GetFlag(FLAGS_num_workers);
  for (const std::string& shard : absl::GetFlag(FLAGS_shards)) {
    if (!shard.empty()) o.shards.insert(shard);
  }
  if (o.shards.empty() && absl::GetFlag(FLAGS_token_file).empty()) {
    std::fprintf(stderr,
                 "bnps_host_bn: warning: without --shards or --token_file "
                 "this aggregator forwards to any address a worker's hello "
                 "names\n");
  }
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = bnps::security::ReadTokenFile(path);
    if (!token.ok()) {
      std::fprintf(stderr, "bnps_host_bn: %s\n",
                   std::string(token.status().message()).c_str());
      return 2;
    }
    o.token = *token;
  }
  bnps::metrics::Registry registry;
  bnps::hostbn::AggregatorMetrics metrics(&registry);
  o.metrics = &metrics;
  absl::StatusOr<std::unique_ptr<bnps::metrics::HttpEndpoint>> endpoint =
      bnps::metrics::StartEndpointFromFlags(&registry);
  if (!endpoint.ok()) {
    std::fprintf(stderr, "bnps_host_bn: %s\n",
                 std::string(endpoint.status().message()).c_str());
    return endpoint.status().code() == absl::StatusCode::kInvalidArgument ? 2
                                                                          : 1;
  }
  if (*endpoint != nullptr) {
    std::printf("bnps_host_bn: metrics at http://%s:%d/metrics\n",
                bnps::metrics::MetricsAddress().c_str(), (*endpoint)->port());
  }
  // SIGTERM and SIGINT end it: waited for here, not handled asynchronously.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  auto aggregator = bnps::hostbn::Aggregator::Start(o);
  if (!aggregator.ok()) {
    std::fprintf(stderr, "bnps_host_bn: %s\n",
                 std::string(aggregator.status().message()).c_str());
    return aggregator.status().code() == absl::StatusCode::kInvalidArgument
               ? 2
               : 1;
  }
  std::printf("bnps_host_bn: for %d workers, listening on %s:%d\n",
              o.workers, o.host.c_str(), (*aggregator)->port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  (*aggregator)->Stop();
  return 0;
}
