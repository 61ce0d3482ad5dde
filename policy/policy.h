// The job's policies, defined once for the server, the worker, the client and
// the tools: which BN policy a job runs (see docs/design.md for what each
// means), how its gradients are applied, and what a shard does when a
// worker is lost. Names are the ones the flags use; the wire has matching
// enums in proto/bnps.proto, converted here.
//
// The BN policy and the gradient mode are independent (--bn_policy,
// --gradients); --policy is the shorthand for the usual pairs:
//
//   --policy  BN while training (--bn_policy)   gradients (--gradients)
//   sync      merged over workers per layer      sync: bulk-synchronous
//   async     merged with recent others          async: stale-synchronous,
//                                                bound --staleness
//   recal     local; recomputed afterwards       sync
//   local     local; averaged afterwards         sync
//
// Any other pair (say sync gradients with async BN) is named by the two
// flags. --staleness bounds both what async gradients may run ahead and how
// old the others' moments async BN merges may be.
//
// Thread-safety: pure functions.

#ifndef BNPS_POLICY_POLICY_H_
#define BNPS_POLICY_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/bnps.pb.h"

namespace bnps::policy {

// The BN policy.
enum class Policy { kSync, kAsync, kRecal, kLocal };

// How gradients are applied.
enum class Gradients {
  kSync,   // bulk-synchronous: once per step, after every live worker pushed
  kAsync,  // stale-synchronous: on arrival, workers at most --staleness apart
};

// A job's BN policy and gradient mode.
struct JobPolicy {
  Policy bn = Policy::kSync;
  Gradients gradients = Gradients::kSync;
  bool operator==(const JobPolicy& o) const {
    return bn == o.bn && gradients == o.gradients;
  }
};

// What happens to steps that need a worker whose heartbeats stopped.
enum class WorkerLoss {
  kFail,    // they fail with FAILED_PRECONDITION naming the worker
  kShrink,  // the worker is dropped; they complete with the others
  kWait,    // they wait (up to their deadlines) for it to come back: a worker
            // restarted with the same id rejoins and the job rolls back to
            // its last checkpoint (docs/reliability.md)
};

// Every BN policy and every gradient mode, in the order the docs list them
// (the frontends' lists of choices come from these, through the C ABI).
inline constexpr Policy kPolicies[] = {Policy::kSync, Policy::kAsync,
                                       Policy::kRecal, Policy::kLocal};
inline constexpr Gradients kGradientModes[] = {Gradients::kSync,
                                               Gradients::kAsync};

// "sync", "async", "recal", "local"; INVALID_ARGUMENT for anything else,
// naming the choices.
absl::StatusOr<Policy> ParsePolicy(absl::string_view name);
std::string PolicyName(Policy p);
// "sync", "async"; INVALID_ARGUMENT for anything else.
absl::StatusOr<Gradients> ParseGradients(absl::string_view name);
std::string GradientsName(Gradients g);
// The gradient mode the --policy shorthand `p` pairs with its BN policy.
inline Gradients ShorthandGradients(Policy p) {
  return p == Policy::kAsync ? Gradients::kAsync : Gradients::kSync;
}
// The pair the three flags name; each may be empty (not given). --bn_policy
// and --gradients win over what --policy implies and default to sync; a
// --policy that contradicts either is INVALID_ARGUMENT saying so (e.g.
// --policy=async --gradients=sync). Unknown names: INVALID_ARGUMENT.
absl::StatusOr<JobPolicy> ResolvePolicy(absl::string_view policy,
                                        absl::string_view bn_policy,
                                        absl::string_view gradients);
// The shorthand ("async") when the pair is one, else
// "bn_policy=async,gradients=sync".
std::string JobPolicyName(const JobPolicy& p);
// The flags that name `p` to bnps_server and bnps_worker: {"--policy=async"}
// when the pair is a shorthand, else {"--bn_policy=async",
// "--gradients=sync"}.
std::vector<std::string> JobPolicyFlags(const JobPolicy& p);
// "fail", "shrink", "wait"; INVALID_ARGUMENT for anything else.
absl::StatusOr<WorkerLoss> ParseWorkerLoss(absl::string_view name);
std::string WorkerLossName(WorkerLoss w);

// Gradients are applied once per step after every live worker pushed (true),
// or on arrival within the staleness bound (false: async).
inline bool BulkSynchronous(Gradients g) { return g == Gradients::kSync; }

// Whether BN layers exchange statistics with the servers while training
// (sync and async); recal and local normalize with local statistics and
// settle the running statistics after training.
inline bool BnTrafficWhileTraining(Policy p) {
  return p == Policy::kSync || p == Policy::kAsync;
}

// OK if a job of `policy` may change its worker count while it runs
// (proto/membership_history.h); FAILED_PRECONDITION ("resizing needs
// --policy=sync") otherwise: the bounded-staleness clocks and the other
// policies' per-worker state are not defined across a change of count.
absl::Status CheckResizable(const JobPolicy& policy);

// OK if --bn_staleness=`bn_staleness` fits the job: -1 (the bounded mode)
// always; s >= 0 under the async BN policy only. INVALID_ARGUMENT naming
// --bn_staleness otherwise.
absl::Status CheckBnStaleness(const JobPolicy& policy, int64_t bn_staleness);

// OK if BN groups of `group_size` consecutive worker ids (--bn_group_size;
// 0: none, the whole job is one group) fit a job of `policy` whose worker
// counts over its run are `worker_counts`: groups need BN traffic while
// training (sync or async BN: local is a group of one, recal has none),
// and group_size must divide every count (so it is at most each).
// INVALID_ARGUMENT naming --bn_group_size otherwise.
absl::Status CheckBnGroups(const JobPolicy& policy, int group_size,
                           absl::Span<const int> worker_counts);

// --bn_group: true for "host" (the workers of each host form a BN group),
// false for "" (groups by --bn_group_size, or none). INVALID_ARGUMENT
// naming the flag otherwise.
absl::StatusOr<bool> ParseBnGroupByHost(absl::string_view bn_group);

// OK if BN groups by host (--bn_group=host) fit a job of `policy` with
// --bn_group_size=`group_size` whose worker counts over its run are
// `worker_counts`: BN traffic while training, no group size besides, and
// one worker count (the groups are fixed once every worker registered).
// INVALID_ARGUMENT naming --bn_group otherwise.
absl::Status CheckBnGroupByHost(const JobPolicy& policy, int group_size,
                                absl::Span<const int> worker_counts);

// The BN group of each worker under --bn_group=host, from the host each
// registered from (`hosts`, by worker id): the hosts are numbered in the
// order of their smallest worker id, so worker 0 is in group 0.
std::vector<int> BnGroupsOfHosts(absl::Span<const std::string> hosts);

// The BN group of each worker id in [0, num_workers) under
// --bn_group_size=`group_size`: worker w is in group w / group_size. Empty
// for 0 (no groups: the job is one). REQUIRES: group_size >= 0.
std::vector<int> BnGroupOfWorkers(int group_size, int num_workers);

// Whether the backward pass needs the two global BN sums (sync only: under
// async the others' statistics are constants).
inline bool GlobalBnBackward(Policy p) { return p == Policy::kSync; }

// The wire's enums. FromProto: INVALID_ARGUMENT for UNSPECIFIED or an
// unknown policy (a peer's config that cannot be trusted).
proto::Policy ToProto(Policy p);
absl::StatusOr<Policy> FromProto(proto::Policy p);
proto::WorkerLossAction ToProto(WorkerLoss w);
// The job's pair from its config: `policy` is the BN policy, `gradients`
// the gradient mode, where UNSPECIFIED (a config written before the field
// existed, or a shorthand pair) means the one --policy implies.
// INVALID_ARGUMENT for an unspecified or unknown policy or gradient mode.
absl::StatusOr<JobPolicy> FromConfig(const proto::JobConfig& c);
// Sets `policy`, and `gradients` only when it is not the shorthand's, so a
// shorthand job's config is byte-for-byte what it was before the field (its
// checkpoints stay readable both ways).
void ToConfig(const JobPolicy& p, proto::JobConfig* c);

}  // namespace bnps::policy

#endif  // BNPS_POLICY_POLICY_H_
