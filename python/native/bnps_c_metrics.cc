// The C ABI's metrics calls (bnps_c.h) over ClientMetrics.

#include "python/native/bnps_c_metrics.h"

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "python/native/bnps_c.h"
#include "python/native/bnps_c_internal.h"

namespace bnps::c_abi {

ClientMetrics::ClientMetrics() : worker_(&registry_) {}

void ClientMetrics::Attach(const std::shared_ptr<ClientMetrics>& metrics,
                           bnps::client::GrpcClientOptions* options) {
  options->on_retry = [metrics](absl::StatusCode code) {
    metrics->worker_.Retry(code);
  };
  options->on_bn_call = [metrics](const std::string& layer, bool backward,
                                  absl::Duration took) {
    metrics->worker_.BnRoundTrip(
        layer,
        backward ? bnps::worker::WorkerMetrics::kBackward
                 : bnps::worker::WorkerMetrics::kForward,
        took);
  };
}

absl::StatusOr<int> ClientMetrics::Serve(const std::string& host, int port) {
  absl::MutexLock lock(&mu_);
  if (endpoint_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this client serves its metrics already, on port ",
        endpoint_->port()));
  }
  absl::StatusOr<std::unique_ptr<bnps::metrics::HttpEndpoint>> e =
      bnps::metrics::HttpEndpoint::Start(host, port, &registry_);
  if (!e.ok()) return e.status();
  endpoint_ = *std::move(e);
  return endpoint_->port();
}

}  // namespace bnps::c_abi

using bnps::c_abi::Fail;
using bnps::c_abi::Str;

extern "C" {

int bnps_client_serve_metrics(bnps_client* c, const char* host, int port,
                              int* bound_port, char* err, size_t err_len) {
  absl::StatusOr<int> p = c->metrics->Serve(Str(host), port);
  BNPS_RETURN_IF_ERROR(p.status());
  if (bound_port != nullptr) *bound_port = *p;
  return 0;
}

int bnps_client_metrics_text(bnps_client* c, char* buf, size_t len,
                             size_t* needed, char* err, size_t err_len) {
  const std::string text = c->metrics->Text();
  if (needed != nullptr) *needed = text.size() + 1;
  if (buf == nullptr || len < text.size() + 1) {
    BNPS_RETURN_IF_ERROR(absl::ResourceExhaustedError(absl::StrCat(
        "the metrics take ", text.size() + 1, " bytes, the buffer ", len)));
  }
  std::memcpy(buf, text.c_str(), text.size() + 1);
  return 0;
}

}  // extern "C"
