// The job's policies, defined once for the server, the worker, the client and
// the tools: which BN policy a job runs (see docs/design.md for what each
// means) and what a shard does when a worker is lost. Names are the ones the
// flags use; the wire has matching enums in proto/bnps.proto, converted here.
//
//   policy  BN while training              gradients
//   sync    merged over workers per layer  bulk-synchronous
//   async   merged with recent others      stale-synchronous (bound s)
//   recal   local; recomputed afterwards   bulk-synchronous
//   local   local; averaged afterwards     bulk-synchronous
//
// Thread-safety: pure functions.

#ifndef BNPS_POLICY_POLICY_H_
#define BNPS_POLICY_POLICY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/bnps.pb.h"

namespace bnps::policy {

enum class Policy { kSync, kAsync, kRecal, kLocal };

// What happens to steps that need a worker whose heartbeats stopped.
enum class WorkerLoss {
  kFail,    // they fail with FAILED_PRECONDITION naming the worker
  kShrink,  // the worker is dropped; they complete with the others
  kWait,    // they wait (up to their deadlines) for it to come back: a worker
            // restarted with the same id rejoins and the job rolls back to
            // its last checkpoint (docs/reliability.md)
};

// "sync", "async", "recal", "local"; INVALID_ARGUMENT for anything else,
// naming the choices.
absl::StatusOr<Policy> ParsePolicy(absl::string_view name);
std::string PolicyName(Policy p);
// "fail", "shrink", "wait"; INVALID_ARGUMENT for anything else.
absl::StatusOr<WorkerLoss> ParseWorkerLoss(absl::string_view name);
std::string WorkerLossName(WorkerLoss w);

// Gradients are applied once per step after every live worker pushed (true),
// or on arrival within the staleness bound (false: async).
inline bool BulkSynchronous(Policy p) { return p != Policy::kAsync; }

// Whether BN layers exchange statistics with the servers while training
// (sync and async); recal and local normalize with local statistics and
// settle the running statistics after training.
inline bool BnTrafficWhileTraining(Policy p) {
  return p == Policy::kSync || p == Policy::kAsync;
}

// Whether the backward pass needs the two global BN sums (sync only: under
// async the others' statistics are constants).
inline bool GlobalBnBackward(Policy p) { return p == Policy::kSync; }

// The wire's enums. FromProto: INVALID_ARGUMENT for UNSPECIFIED or an
// unknown policy (a peer's config that cannot be trusted).
proto::Policy ToProto(Policy p);
absl::StatusOr<Policy> FromProto(proto::Policy p);
proto::WorkerLossAction ToProto(WorkerLoss w);

}  // namespace bnps::policy

#endif  // BNPS_POLICY_POLICY_H_
