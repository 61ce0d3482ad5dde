// The clocks of a job's workers and the bounded-staleness (SSP) rules on them.
//
// Each of W workers (ids 0..W-1) has a clock: the number of steps it has
// completed, starting at 0. With bound s >= 0, worker w may begin step c only if
// every live worker has completed at least c - s steps (MinLiveClock() >= c - s);
// s = 0 is lock-step (bulk-synchronous). A removed (dead) worker no longer holds
// anyone back; removal freezes its clock, and only Restore undoes it. A
// contribution (for example BN statistics) produced at clock k is admissible
// for step c iff k >= c - s.
//
// ClockTable is the pure bookkeeping: it never waits (the server's step
// clocks, server/step_clocks.h, wait on it). Because clocks only grow, removal
// only shrinks the live set and Restore never brings back a clock below
// MinLiveClock(), MinLiveClock() never decreases while a worker is live, so a
// permission once granted stays valid.
//
// Example:
//   absl::StatusOr<ClockTable> table = ClockTable::Create(/*num_workers=*/4,
//                                                        /*staleness=*/1);
//   if (table->MayStart(w, table->clock(w))) { ...; table->Advance(w, c + 1); }
//
// Errors: INVALID_ARGUMENT for an unknown worker id or a bad argument;
// FAILED_PRECONDITION for a request that breaks the rules (a clock that goes
// back, a step the bound never allowed, a removed worker that reports progress).
//
// Thread-safety: not thread-safe; a plain value (copyable). Callers serialize
// access.

#ifndef BNPS_STALENESS_CLOCK_TABLE_H_
#define BNPS_STALENESS_CLOCK_TABLE_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace bnps::staleness {

// True iff a contribution made at `contribution_clock` is admissible for a
// worker at `step` under the bound `staleness` (>= 0): contribution_clock >=
// step - staleness, without overflow. The one rule behind both the clocks
// (ClockTable::MayStart) and the async BN merge (policy/async_bn.h).
bool Admissible(int64_t contribution_clock, int64_t step, int64_t staleness);

class ClockTable {
 public:
  // MinLiveClock() when no worker is live: nobody holds anyone back.
  static constexpr int64_t kNoLiveWorkers = std::numeric_limits<int64_t>::max();

  // All workers live at clock 0. INVALID_ARGUMENT if num_workers < 1 or
  // staleness < 0.
  static absl::StatusOr<ClockTable> Create(int num_workers, int64_t staleness);

  // Records that `worker` has completed `completed` steps. Idempotent for the
  // current value (RPCs are retried). INVALID_ARGUMENT if the id is unknown or
  // `completed` < 0; FAILED_PRECONDITION if the worker was removed, if
  // `completed` is below its clock, or if completed > MinLiveClock() + s + 1
  // (the worker could not have been allowed to begin step completed - 1).
  absl::Status Advance(int worker, int64_t completed);

  // Removes `worker` from the job for good: it stops holding others back and can
  // no longer advance. Removing a removed worker is OK (idempotent).
  // INVALID_ARGUMENT if the id is unknown.
  absl::Status Remove(int worker);

  // Makes a removed worker live again, at its frozen clock (a worker that
  // left before the job began, coming back). OK for a live worker.
  // INVALID_ARGUMENT if the id is unknown; FAILED_PRECONDITION if its clock
  // is below MinLiveClock() (some worker being live): the others may have
  // begun steps it would block.
  absl::Status Restore(int worker);

  // True iff `worker` is a live worker and the bound lets it begin `step`:
  // MinLiveClock() >= step - s. `step` is normally clock(worker). False for an
  // unknown or removed worker.
  bool MayStart(int worker, int64_t step) const;

  // The live workers whose clock < step - s (those that block `step`), in
  // increasing id order. Empty iff the bound lets a live worker begin `step`.
  std::vector<int> Laggards(int64_t step) const;

  // The smallest clock of a live worker; kNoLiveWorkers if none is live.
  int64_t MinLiveClock() const;

  // The clock of `worker` (frozen once removed); -1 for an unknown id.
  int64_t clock(int worker) const;
  // False for an unknown id.
  bool IsLive(int worker) const;
  bool IsValidWorker(int worker) const {
    return worker >= 0 && worker < num_workers();
  }

  int num_workers() const { return static_cast<int>(clocks_.size()); }
  int num_live() const { return num_live_; }
  int64_t staleness() const { return staleness_; }

 private:
  ClockTable(int num_workers, int64_t staleness);

  // clock >= step - s, without overflow.
  bool WithinBound(int64_t clock, int64_t step) const;

  int64_t staleness_;
  std::vector<int64_t> clocks_;
  std::vector<bool> live_;
  int num_live_;
};

}  // namespace bnps::staleness

#endif  // BNPS_STALENESS_CLOCK_TABLE_H_
