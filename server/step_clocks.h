// The workers' clocks under the async policy (kept by shard 0), with waiting
// that never blocks a thread: StartStep answers through a callback as soon as
// the staleness bound lets the worker begin the step (at once if it already
// does), or fails at its deadline naming the laggards.
//
// Errors: as staleness::ClockTable; DEADLINE_EXCEEDED at a deadline; the status
// given to FailWorker for waits that need a failed worker, and for StartStep
// and FinishStep of the failed worker itself (the job dropped it).
// Thread-safety: thread-safe; callbacks run without the lock held.

#ifndef BNPS_SERVER_STEP_CLOCKS_H_
#define BNPS_SERVER_STEP_CLOCKS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "util/waiters.h"
#include "staleness/clock_table.h"

namespace bnps::server {

class StepClocks {
 public:
  // Answers with the slowest live worker's clock.
  using Done = std::function<void(absl::StatusOr<int64_t>)>;

  static absl::StatusOr<std::unique_ptr<StepClocks>> Create(int num_workers,
                                                              int64_t staleness);

  void StartStep(int worker, int64_t step, absl::Time deadline, Done done);
  absl::Status FinishStep(int worker, int64_t completed);
  void RemoveWorker(int worker);
  void FailWorker(int worker, absl::Status why);
  // Undoes RemoveWorker and FailWorker; as ClockTable::Restore.
  absl::Status RestoreWorker(int worker);
  void ExpireDeadlines(absl::Time now);
  // Sets every worker's clock to `clocks` (a checkpoint's); waiting
  // StartSteps fail with `why`. From then on a FinishStep below the
  // worker's clock (a step replayed after the rollback) is acknowledged. INVALID_ARGUMENT for another worker count
  // or a negative clock.
  absl::Status Restore(const std::vector<int64_t>& clocks,
                       const absl::Status& why);

  int64_t clock(int worker) const;

 private:
  explicit StepClocks(staleness::ClockTable table);

  struct Waiter {
    int worker;
    int64_t step;
    absl::Time deadline;
    Done done;
  };
  using Ready = util::ReadyCallbacks;

  // Moves waiters that may start, or never will, to `ready`.
  void Collect(Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string LaggardText(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  staleness::ClockTable table_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  // Restored from a checkpoint: a worker replays steps it had finished, and
  // a FinishStep below its clock is acknowledged.
  bool restored_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_STEP_CLOCKS_H_
