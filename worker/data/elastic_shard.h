// Which examples each worker trains on at a step of a job whose worker count
// may change between steps (server/membership_history.h): the one data rule
// of every run, elastic or not.
//
// An epoch is cut for the job's first count W0 (its base): base worker b of
// W0 owns the contiguous positions [b*n/W0, (b+1)*n/W0) of the epoch's
// permutation and takes batch_size of them per step (batcher.h), so an epoch
// has StepsPerEpoch(W0) steps whatever happens later. Step k's GLOBAL batch is
// the union of the base workers' k-th batches, in base-worker order. At a
// step with W workers:
//   W == W0: worker v takes base worker v's batch (the rule of a fixed job);
//   W != W0: worker v takes the contiguous slice [v*G/W, (v+1)*G/W) of the
//            global batch (G examples), so per-worker batches differ by at
//            most one example and may be empty.
// The global batch of a step therefore depends on the step alone, never on
// the count: a job resized at step N trains on the same examples as one that
// stops at N and restarts with the new count, and (under sync BN, whose step
// equals one worker on the concatenated batch) the same computation.
//
// Thread-safety: pure functions.

#ifndef BNPS_WORKER_DATA_ELASTIC_SHARD_H_
#define BNPS_WORKER_DATA_ELASTIC_SHARD_H_

#include <cstdint>
#include <vector>

namespace bnps::worker {

// How an epoch is cut: its examples, the base count W0, the per-worker batch
// of the base and whether each base shard drops its short last batch.
struct EpochCut {
  int64_t examples = 0;
  int base_workers = 1;
  int64_t batch_size = 1;
  bool drop_last = false;
};

// The positions (indices into the epoch's permutation, ascending within each
// base worker's run) that `worker` of `num_workers` trains on at step
// `step_in_epoch` of an epoch cut by `cut`. Empty for a step past the epoch,
// a worker outside [0, num_workers), or counts < 1.
std::vector<int64_t> StepPositions(const EpochCut& cut, int64_t step_in_epoch,
                                   int worker, int num_workers);

}  // namespace bnps::worker

#endif  // BNPS_WORKER_DATA_ELASTIC_SHARD_H_
