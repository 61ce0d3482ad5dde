// What the C ABI's translation units share (python/native/bnps_c*.cc): the
// handles' definitions, and the status translation (bnps_c_status.h). Not
// part of the ABI.

#ifndef BNPS_PYTHON_NATIVE_BNPS_C_INTERNAL_H_
#define BNPS_PYTHON_NATIVE_BNPS_C_INTERNAL_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/grpc_ps_client.h"
#include "client/worker_bn.h"
#include "python/native/bnps_c_status.h"

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

#endif  // BNPS_PYTHON_NATIVE_BNPS_C_INTERNAL_H_
