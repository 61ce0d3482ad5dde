#include "hostbn/host_bn_main.h"

#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "hostbn/aggregator_metrics.h"
#include "metrics/http_endpoint.h"
#include "metrics/metrics_flags.h"
#include "metrics/registry.h"

namespace bnps::hostbn {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "bnps_host_bn: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int RunHostBn(const HostBnOptions& options) {
  Aggregator::Options o = options.aggregator;
  if (o.shards.empty() && o.token.empty()) {
    std::fprintf(stderr,
                 "bnps_host_bn: warning: without --shards or --token_file "
                 "this aggregator forwards to any address a worker's hello "
                 "names\n");
  }
  metrics::Registry registry;
  AggregatorMetrics metrics(&registry);
  o.metrics = &metrics;
  absl::StatusOr<std::unique_ptr<metrics::HttpEndpoint>> endpoint =
      metrics::StartEndpointFromFlags(&registry);
  if (!endpoint.ok()) return Fail(endpoint.status());
  if (*endpoint != nullptr) {
    std::printf("bnps_host_bn: metrics at http://%s:%d/metrics\n",
                metrics::MetricsAddress().c_str(), (*endpoint)->port());
  }
  // SIGTERM and SIGINT end it: waited for here, not handled asynchronously.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  absl::StatusOr<std::unique_ptr<Aggregator>> aggregator = Aggregator::Start(o);
  if (!aggregator.ok()) return Fail(aggregator.status());
  std::printf("bnps_host_bn: for %d workers, listening on %s:%d\n", o.workers,
              o.host.c_str(), (*aggregator)->port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  (*aggregator)->Stop();
  return 0;
}

}  // namespace bnps::hostbn
