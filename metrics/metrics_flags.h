// The flags of a binary that serves Prometheus metrics (bnps_server,
// bnps_worker): --metrics_port and --metrics_address. Linking this library
// defines them; StartEndpointFromFlags reads them once the command line is
// parsed.
//
// Example:
//   metrics::Registry registry;
//   absl::StatusOr<std::unique_ptr<metrics::HttpEndpoint>> endpoint =
//       metrics::StartEndpointFromFlags(&registry);
//   if (!endpoint.ok()) ...          // a bad port, or it cannot listen
//   if (*endpoint != nullptr) ...    // serving at (*endpoint)->port()

#ifndef BNPS_METRICS_METRICS_FLAGS_H_
#define BNPS_METRICS_METRICS_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/http_endpoint.h"
#include "metrics/registry.h"

namespace bnps::metrics {

// INVALID_ARGUMENT unless --metrics_port is in [0, 65535].
absl::Status CheckMetricsFlags();

// The value of --metrics_address.
std::string MetricsAddress();

// Serves `registry` (not owned; must outlive the endpoint) at
// http://<--metrics_address>:<--metrics_port>/metrics; nullptr when
// --metrics_port is 0 (the default: no endpoint). Errors as
// CheckMetricsFlags and HttpEndpoint::Start.
absl::StatusOr<std::unique_ptr<HttpEndpoint>> StartEndpointFromFlags(
    Registry* registry);

}  // namespace bnps::metrics

#endif  // BNPS_METRICS_METRICS_FLAGS_H_
