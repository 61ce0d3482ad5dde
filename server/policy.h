// The BN/gradient policies and what a shard does when a worker is lost, as the
// server's plain C++ types (the wire has matching enums in proto/bnps.proto).

#ifndef BNPS_SERVER_POLICY_H_
#define BNPS_SERVER_POLICY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bnps::server {

enum class Policy { kSync, kAsync, kRecal, kLocal };

// What happens to steps that need a worker whose heartbeats stopped.
enum class WorkerLoss {
  kFail,    // they fail with FAILED_PRECONDITION naming the worker
  kShrink,  // the worker is dropped; they complete with the others
};

absl::StatusOr<Policy> ParsePolicy(absl::string_view name);
std::string PolicyName(Policy p);
absl::StatusOr<WorkerLoss> ParseWorkerLoss(absl::string_view name);
std::string WorkerLossName(WorkerLoss w);

// Gradients are applied once per step after every live worker pushed (true),
// or on arrival within the staleness bound (false: the async policy).
inline bool BulkSynchronous(Policy p) { return p != Policy::kAsync; }

}  // namespace bnps::server

#endif  // BNPS_SERVER_POLICY_H_
