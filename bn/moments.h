// Per-channel moments of a batch and their exact merge.
//
// Moments are what workers exchange about a BN layer: the count of samples per
// channel, and per channel the mean and M2 (the sum of squared deviations from
// that mean), all in double. Merging partial moments with Chan et al.'s parallel
// formula gives the moments of the union without the catastrophic cancellation of
// sum / sum-of-squares (which in float32 loses the variance entirely once
// |mean| >> std). Every merge is weighted by counts; a zero count is legal and
// contributes nothing.
//
// Floating-point merging is not associative, so the order of a merge is part of
// its result. MergeMoments merges in the order given; OrderedMerger files parts by
// slot (a worker index) and merges in slot order, so the result is bitwise the
// same whatever order the parts arrived in.
//
// Example:
//   OrderedMerger merger(/*num_slots=*/workers, /*channels=*/c);
//   for (auto& [worker, part] : arrivals) RETURN_IF_ERROR(merger.Add(worker, part));
//   Moments global = merger.Merge();
//   std::vector<double> var = BiasedVariance(global);
//
// Thread-safety: plain values and functions; OrderedMerger is not thread-safe
// (callers serialize access).

#ifndef BNPS_BN_MOMENTS_H_
#define BNPS_BN_MOMENTS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace bnps::bn {

struct Moments {
  int64_t count = 0;         // samples per channel (N * H * W)
  std::vector<double> mean;  // per channel; 0 when count == 0
  std::vector<double> m2;    // per channel: sum of squared deviations, >= 0

  // Zero-count moments for `channels` channels: the identity of the merge.
  static Moments Empty(int64_t channels);

  int64_t channels() const { return static_cast<int64_t>(mean.size()); }
};

// OK if the moments are well formed: count >= 0, mean and m2 of equal non-zero
// size, every value finite, m2 >= 0, and mean == m2 == 0 when count == 0.
// INVALID_ARGUMENT otherwise. Moments that arrive over a network must pass this
// before they are merged.
absl::Status ValidateMoments(const Moments& m);

// Merges `part` into `*acc` (Chan's formula, in double). An `*acc` with count
// 0 becomes a copy of `part` when part's count is positive (a `part` with
// count 0 leaves `*acc` as it is), so it may start as Moments{}.
// REQUIRES: `part` valid; `*acc` valid or with count 0; the same number of
// channels when both counts are positive.
void MergeInto(const Moments& part, Moments* acc);

// Merges `parts` in the order given, skipping null entries: the one ordered
// merge, which the server's barriers (worker order), a host's replicas
// (replica order), OrderedMerger and MergeMoments all use, so that equal
// inputs in equal order give equal bits everywhere. Moments::Empty(channels)
// if no part has a positive count. REQUIRES: every non-null part valid,
// with `channels` channels (a caller that received them validated them).
Moments MergeInOrder(absl::Span<const Moments* const> parts, int64_t channels);

// Merges `parts` in the order given. INVALID_ARGUMENT if `parts` is empty, a part
// is invalid, or the parts disagree on the number of channels.
absl::StatusOr<Moments> MergeMoments(absl::Span<const Moments> parts);

// Biased (population) variance M2 / count, used to normalize; 0 for count 0.
std::vector<double> BiasedVariance(const Moments& m);

// Unbiased variance M2 / (count - 1), used for running statistics.
// FAILED_PRECONDITION if count < 2.
absl::StatusOr<std::vector<double>> UnbiasedVariance(const Moments& m);

// Collects one Moments per slot (for example per worker) and merges them in slot
// order, independent of the order Add was called in.
class OrderedMerger {
 public:
  // REQUIRES: num_slots >= 1, channels >= 1.
  OrderedMerger(int num_slots, int64_t channels);

  // Files `part` under `slot`. INVALID_ARGUMENT if the slot is out of range or
  // the part is invalid or has the wrong number of channels; ALREADY_EXISTS if
  // the slot is already filled (the first value is kept).
  absl::Status Add(int slot, Moments part);

  bool Has(int slot) const;
  int num_filled() const { return num_filled_; }
  int num_slots() const { return static_cast<int>(slots_.size()); }

  // The merge of the filled slots in slot order; Moments::Empty if none.
  Moments Merge() const;

 private:
  const int64_t channels_;
  std::vector<std::optional<Moments>> slots_;
  int num_filled_ = 0;
};

// Running statistics of a BN layer, used at inference. Start at mean 0, var 1.
struct RunningStats {
  std::vector<double> mean;
  std::vector<double> var;  // unbiased

  static RunningStats Initial(int64_t channels);
};

// running = (1 - momentum) * running + momentum * batch, with the batch's
// unbiased variance for `var` (as PyTorch does). A batch with count 0 leaves
// `*stats` unchanged. INVALID_ARGUMENT if momentum is outside [0, 1], the batch
// is invalid or the channel counts differ; FAILED_PRECONDITION if the batch has
// exactly one sample per channel (no unbiased variance).
absl::Status UpdateRunningStats(const Moments& batch, double momentum,
                                RunningStats* stats);

// UpdateRunningStats for a batch already known good: moments decoded by
// proto::DecodeMoments (which validates them), computed by a kernel, or
// merged from such moments. It checks nothing.
// REQUIRES: ValidateMoments(batch).ok(), batch.count >= 2, momentum in
// [0, 1], and `*stats` of batch's channel count.
void MixIntoRunningStats(const Moments& batch, double momentum,
                         RunningStats* stats);

}  // namespace bnps::bn

#endif  // BNPS_BN_MOMENTS_H_
