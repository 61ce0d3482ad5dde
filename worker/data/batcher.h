// Float NCHW batches of a Dataset for one worker of a data-parallel job.
//
// Sharding. Every epoch, all examples (the first `limit` of them, if set) are
// permuted by a generator that depends only on (seed, epoch) -- so the
// permutation is the same on every worker, every run, every platform (the
// shuffle is written out here, not left to <random>) -- and worker w of W takes
// the positions [w*n/W, (w+1)*n/W) of it, rounded down. The shards are
// contiguous and disjoint, their sizes differ by at most one, and together they
// use every example exactly once per epoch. Without shuffle the permutation is
// the identity, so worker w reads examples w*n/W, w*n/W + 1, ... in order.
//
// Steps. Under the sync policy every worker must take part in every step, so
// all workers run the same number of steps per epoch: StepsPerEpoch(), enough
// batches of batch_size for the LARGEST shard. A worker whose shard runs out
// earlier gets empty batches (n == 0; images, labels and indices empty) for the
// remaining steps; a zero-sample batch is legal in bnps (its BN moments have
// count 0). The last non-empty batch of a shard may be short; with drop_last it
// is dropped instead (the worker gets an empty batch in its place), so every
// non-empty batch has exactly batch_size examples and StepsPerEpoch counts only
// the full batches of the largest shard.
//
// A job whose worker count changes between steps (server/membership_history.h)
// keeps its epochs cut for its first count (epoch_workers) and splits each
// step's global batch among the workers of that step (SetNumWorkers), by the
// rule of worker/data/elastic_shard.h, which is the rule above when the
// counts are equal.
//
// Pixels are scaled to [0, 1] and normalized: x = (p / 255 - mean) / std.
//
// Example (worker 2 of 4):
//   BatcherOptions options;
//   options.worker = 2;
//   options.num_workers = 4;
//   options.batch_size = 64;
//   absl::StatusOr<Batcher> batcher = Batcher::Create(&train, options);
//   if (!batcher.ok()) return batcher.status();
//   Batch batch;
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     batcher->StartEpoch(epoch);
//     while (batcher->Next(&batch)) { ... one step; batch.n may be 0 ... }
//   }
//
// Ownership: the Batcher keeps a pointer to the Dataset, which must outlive it
// and not change while it exists.
//
// Thread-safety: StepsPerEpoch is thread-safe; a Batcher is not (callers
// serialize access). Batchers on the same Dataset may run in parallel.

#ifndef BNPS_WORKER_DATA_BATCHER_H_
#define BNPS_WORKER_DATA_BATCHER_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace bnps::worker {

struct BatcherOptions {
  // This worker, in [0, num_workers). Default: 0.
  int worker = 0;
  // Workers sharing the dataset, >= 1. Default: 1.
  int num_workers = 1;
  // Examples per batch, per worker, >= 1. Default: 32.
  int64_t batch_size = 32;
  // Seed of the per-epoch permutation; must be the same on every worker.
  // Default: 1.
  uint64_t seed = 1;
  // Permute the examples every epoch; false keeps the dataset's order.
  // Default: true.
  bool shuffle = true;
  // Use only the first `limit` examples of the dataset (all of them if it has
  // fewer); 0 uses all. Must be >= 0. Default: 0.
  int64_t limit = 0;
  // Normalization after scaling pixels to [0, 1]; std > 0, both finite.
  // Default: Fashion-MNIST's pixel mean and standard deviation.
  float mean = 0.2860f;
  float std = 0.3530f;
  // Drop each shard's last short batch. Default: false.
  bool drop_last = false;
  // The count the epochs are cut for: the job's first count when it was
  // resized (elastic_shard.h); 0: num_workers. Default: 0.
  int epoch_workers = 0;
};

// The examples a job uses: dataset_size, or `limit` of them if that is fewer.
int64_t EffectiveExamples(const BatcherOptions& options, int64_t dataset_size);

// The steps of an epoch, the same on every worker: ceil(largest shard /
// batch_size), or floor(...) with drop_last; the largest shard is
// ceil(EffectiveExamples / W), W the epoch_workers (num_workers if 0). 0 if
// W or batch_size < 1.
int64_t StepsPerEpoch(const BatcherOptions& options, int64_t dataset_size);

struct Batch {
  int64_t n = 0;  // examples in this batch; 0 for an empty batch
  int64_t channels = 1;
  int64_t height = 0;
  int64_t width = 0;
  std::vector<float> images;     // n * channels * height * width, NCHW
  std::vector<int32_t> labels;   // n
  std::vector<int64_t> indices;  // n: which dataset examples (for tests, logs)
};

class Batcher {
 public:
  // A batcher for options.worker, positioned at the start of epoch 0.
  // INVALID_ARGUMENT if `dataset` is null, inconsistent (ValidateDataset) or
  // empty, or an option is out of range: num_workers < 1, worker outside
  // [0, num_workers), epoch_workers < 0, batch_size < 1, limit < 0, std <= 0,
  // mean or std not finite.
  static absl::StatusOr<Batcher> Create(const Dataset* dataset,
                                        BatcherOptions options);

  // Starts `epoch` (any value; epochs need not come in order): computes its
  // permutation and rewinds to its first step.
  void StartEpoch(int64_t epoch);

  // Fills `*out` with the next batch of this epoch and returns true, or
  // returns false (leaving `*out` alone) once all batches_per_epoch() steps
  // were taken. The batch is empty (n == 0) once this worker's shard is used
  // up. `*out`'s buffers are reused. REQUIRES: out != nullptr.
  bool Next(Batch* out);

  // From the next batch on, yields the batches of options().worker as one of
  // `num_workers` (a resized job; elastic_shard.h). INVALID_ARGUMENT, changing
  // nothing, unless the worker is in [0, num_workers).
  absl::Status SetNumWorkers(int num_workers);

  // StepsPerEpoch(options, dataset size): how often Next returns true per
  // epoch. The same on every worker.
  int64_t batches_per_epoch() const { return steps_per_epoch_; }
  // The examples this worker yields per epoch while the count is the
  // epochs' own: its shard, less a short last batch under drop_last.
  int64_t examples_per_epoch() const;
  // This worker's shard: [shard_begin(), shard_end()) of the permutation.
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }

  int64_t epoch() const { return epoch_; }
  // Steps taken in this epoch (calls of Next that returned true).
  int64_t step() const { return step_; }
  const BatcherOptions& options() const { return options_; }

 private:
  Batcher(const Dataset* dataset, const BatcherOptions& options);

  const Dataset* dataset_;
  BatcherOptions options_;
  int64_t examples_ = 0;  // EffectiveExamples
  int64_t shard_begin_ = 0;
  int64_t shard_end_ = 0;
  int64_t steps_per_epoch_ = 0;
  std::array<float, 256> normalized_{};  // pixel value -> network input

  int64_t epoch_ = 0;
  int64_t step_ = 0;
  std::vector<int64_t> permutation_;  // this epoch's dataset indices
};

// The permutation of [0, n) for (seed, epoch) that Batcher uses: the identity
// if !shuffle. Exposed for tests and tools.
std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch,
                                      bool shuffle);

}  // namespace bnps::worker

#endif  // BNPS_WORKER_DATA_BATCHER_H_
