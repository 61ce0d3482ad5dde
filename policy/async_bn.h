// The async policy's BN rule (docs/design.md), in one place for the server
// that merges and the worker that normalizes.
//
// A worker at step c sends its fresh moments and gets back, without waiting,
// the merge of the other live workers' latest moments whose step is
// admissible at c (staleness::Admissible: step >= c - s), merged in worker
// order so the answer does not depend on arrival order. It normalizes with
// merge(own fresh moments, that). With BN groups (--bn_group_size) "the
// others" are those of its group; the running statistics still merge every
// group's. The others' moments are constants in the
// backward pass, so no global backward sums are exchanged.
//
// Thread-safety: pure functions.

#ifndef BNPS_POLICY_ASYNC_BN_H_
#define BNPS_POLICY_ASYNC_BN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "bn/moments.h"

namespace bnps::policy {

// A worker's newest forward moments of one layer; step -1: none yet.
struct LatestMoments {
  int64_t step = -1;
  bn::Moments moments;
};

struct AsyncMerge {
  // The admissible others' moments of self's group: what the server
  // answers.
  bn::Moments others;
  int contributors = 0;  // workers merged into `others`
  // `self`'s and the admissible others' moments, every group's, in worker
  // order: what the server updates the layer's running statistics with.
  bn::Moments all;
  // step - the step of each other worker's moments merged into `others`
  // (their staleness), in worker order.
  std::vector<int64_t> staleness;
};

// Merges the entries of `latest` (indexed by worker) for worker `self` at
// `step`: workers that are not live or have no moments are skipped, as are
// others whose step is not admissible under `staleness`. `group` is each
// worker's BN group (policy::BnGroupOfWorkers; empty: one group): only
// self's group's others go into `others`. `channels` is the layer's
// channel count. REQUIRES: latest.size() == live.size(), group empty or of
// that size, self in range, and every present entry has `channels`
// channels.
AsyncMerge MergeForAsync(const std::vector<LatestMoments>& latest,
                         const std::vector<bool>& live,
                         const std::vector<int>& group, int self, int64_t step,
                         int64_t staleness, int64_t channels);

// What a worker normalizes with: merge(own, others), own first. Errors as
// bn::MergeMoments (channel counts that differ).
absl::StatusOr<bn::Moments> NormalizingMoments(const bn::Moments& own,
                               const bn::Moments& others);

}  // namespace bnps::policy

#endif  // BNPS_POLICY_ASYNC_BN_H_
