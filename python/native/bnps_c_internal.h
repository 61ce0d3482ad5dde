// What the C ABI's translation units share (python/native/bnps_c*.cc): the
// handles' definitions and the status translation. Not part of the ABI.

#ifndef BNPS_PYTHON_NATIVE_BNPS_C_INTERNAL_H_
#define BNPS_PYTHON_NATIVE_BNPS_C_INTERNAL_H_

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/grpc_ps_client.h"
#include "client/worker_bn.h"

namespace bnps::c_abi {
class ClientMetrics;  // bnps_c_metrics.h
}  // namespace bnps::c_abi

struct bnps_client {
  absl::Mutex mu;
  // Shared with the calls in flight: close() drops this reference, and the
  // connection goes once they have returned.
  std::shared_ptr<bnps::client::GrpcPsClient> client ABSL_GUARDED_BY(mu);
  // The connection's metrics, fed from Connect on; set before the handle is
  // handed out, then immutable.
  std::shared_ptr<bnps::c_abi::ClientMetrics> metrics;
};

struct bnps_worker_bn {
  bnps::client::WorkerBn rule;
};

namespace bnps::c_abi {

// The status code of `s` (0 for OK); its message into `err` (`err_len`
// bytes, NUL-terminated, truncated to fit; `err` may be null).
inline int Fail(const absl::Status& s, char* err, size_t err_len) {
  if (err != nullptr && err_len > 0) {
    const std::string m(s.message());
    const size_t n = std::min(m.size(), err_len - 1);
    std::memcpy(err, m.data(), n);
    err[n] = '\0';
  }
  return s.ok() ? 0 : static_cast<int>(s.code());
}

inline std::string Str(const char* s) { return s == nullptr ? "" : s; }

// A reference to the connection, or FAILED_PRECONDITION once closed.
inline absl::StatusOr<std::shared_ptr<bnps::client::GrpcPsClient>> Get(
    bnps_client* c) {
  absl::MutexLock lock(&c->mu);
  if (c->client == nullptr) {
    return absl::FailedPreconditionError("the bnps client is closed");
  }
  return c->client;
}

}  // namespace bnps::c_abi

// In a C ABI function with `err` and `err_len` parameters: returns the code
// of a failed `expr`.
#define BNPS_RETURN_IF_ERROR(expr)                                  \
  do {                                                              \
    absl::Status s_ = (expr);                                       \
    if (!s_.ok()) return ::bnps::c_abi::Fail(s_, err, err_len);     \
  } while (0)

#endif  // BNPS_PYTHON_NATIVE_BNPS_C_INTERNAL_H_
