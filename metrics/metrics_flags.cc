#include "metrics/metrics_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(int, metrics_port, 0,
          "Serve Prometheus metrics over HTTP at "
          "http://<metrics_address>:<metrics_port>/metrics (docs/"
          "observability.md). 0, the default: no metrics endpoint.");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1",
          "Address the metrics endpoint listens on (plain HTTP, no "
          "authentication). 0.0.0.0 lets a Prometheus on another machine "
          "scrape it.");

namespace bnps::metrics {

absl::Status CheckMetricsFlags() {
  const int port = absl::GetFlag(FLAGS_metrics_port);
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port ", port, " is not a port"));
  }
  return absl::OkStatus();
}

std::string MetricsAddress() { return absl::GetFlag(FLAGS_metrics_address); }

absl::StatusOr<std::unique_ptr<HttpEndpoint>> StartEndpointFromFlags(
    Registry* registry) {
  if (absl::Status s = CheckMetricsFlags(); !s.ok()) return s;
  const int port = absl::GetFlag(FLAGS_metrics_port);
  if (port == 0) return std::unique_ptr<HttpEndpoint>();
  return HttpEndpoint::Start(MetricsAddress(), port, registry);
}

}  // namespace bnps::metrics
