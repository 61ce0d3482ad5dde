// A C ABI client's Prometheus metrics (bnps_client_serve_metrics,
// bnps_client_metrics_text): bnps_worker's series (worker/worker_metrics.h:
// the BN round trips per layer and pass, the retries) in a registry of the
// client's own, fed by the connection's hooks from Connect on, and served
// over HTTP once asked. Not part of the ABI.
//
// Thread-safety: thread-safe.

#ifndef BNPS_PYTHON_NATIVE_BNPS_C_METRICS_H_
#define BNPS_PYTHON_NATIVE_BNPS_C_METRICS_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/grpc_options.h"
#include "metrics/http_endpoint.h"
#include "metrics/registry.h"
#include "worker/worker_metrics.h"

namespace bnps::c_abi {

class ClientMetrics {
 public:
  ClientMetrics();

  // Sets the options' on_retry and on_bn_call to feed `metrics` (the
  // connection then keeps it alive).
  static void Attach(const std::shared_ptr<ClientMetrics>& metrics,
                     bnps::client::GrpcClientOptions* options);

  // Serves the registry at http://host:port/metrics (port 0: a free one)
  // until this is destroyed; returns the port. FAILED_PRECONDITION when it
  // serves already; otherwise metrics::HttpEndpoint::Start's errors.
  absl::StatusOr<int> Serve(const std::string& host, int port)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The Prometheus text exposition.
  std::string Text() const { return registry_.TextExposition(); }

 private:
  bnps::metrics::Registry registry_;
  bnps::worker::WorkerMetrics worker_;
  absl::Mutex mu_;
  std::unique_ptr<bnps::metrics::HttpEndpoint> endpoint_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::c_abi

#endif  // BNPS_PYTHON_NATIVE_BNPS_C_METRICS_H_
