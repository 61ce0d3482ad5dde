// A thread-safe ClockTable that workers (or the server threads serving them) wait
// on before beginning a step.
//
// WaitToStart(w, c, deadline) returns as soon as the bounded-staleness rule lets
// worker w begin step c (at once if it already does: the gate never waits unless
// the bound would break); it is woken by Advance and Remove from other threads.
// Cancel() shuts the gate: every waiter, and every later wait, gets CANCELLED.
// Advance and Remove keep working after Cancel.
//
// Example (one worker's loop):
//   for (int64_t c = 0; c < steps; ++c) {
//     if (absl::Status s = gate->WaitToStart(w, c, absl::Now() + timeout); !s.ok())
//       return s;
//     ... run step c ...
//     if (absl::Status s = gate->Advance(w, c + 1); !s.ok()) return s;
//   }
//
// Errors: those of ClockTable, plus for WaitToStart DEADLINE_EXCEEDED (naming the
// laggard workers and their clocks), CANCELLED after Cancel(), and
// FAILED_PRECONDITION if the waiting worker is (or gets) removed.
//
// Thread-safety: thread-safe; all methods may be called concurrently.

#ifndef BNPS_STALENESS_STALENESS_GATE_H_
#define BNPS_STALENESS_STALENESS_GATE_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "staleness/clock_table.h"

namespace bnps::staleness {

class StalenessGate {
 public:
  // INVALID_ARGUMENT if num_workers < 1 or staleness < 0 (as ClockTable::Create).
  static absl::StatusOr<std::unique_ptr<StalenessGate>> Create(int num_workers,
                                                               int64_t staleness);

  explicit StalenessGate(ClockTable table);
  StalenessGate(const StalenessGate&) = delete;
  StalenessGate& operator=(const StalenessGate&) = delete;

  // As ClockTable::Advance and ClockTable::Remove; on success they wake the
  // waiters whose condition may now hold.
  absl::Status Advance(int worker, int64_t completed) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Remove(int worker) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until `worker` may begin `step` (OK), `deadline` passes
  // (DEADLINE_EXCEEDED, naming the laggards), the gate is cancelled (CANCELLED),
  // or `worker` is removed (FAILED_PRECONDITION). INVALID_ARGUMENT for an unknown
  // id. Never blocks when the answer is already known, even if `deadline` has
  // passed. `step` is normally the worker's clock.
  absl::Status WaitToStart(int worker, int64_t step, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes all waiters with CANCELLED; every later WaitToStart returns CANCELLED.
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);

  // Snapshots; they may be stale as soon as they return.
  bool MayStart(int worker, int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t MinLiveClock() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t clock(int worker) const ABSL_LOCKS_EXCLUDED(mu_);
  bool IsLive(int worker) const ABSL_LOCKS_EXCLUDED(mu_);
  int num_live() const ABSL_LOCKS_EXCLUDED(mu_);
  ClockTable Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  bool Admissible(int64_t contribution_clock, int64_t step) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Fixed at creation.
  int num_workers() const { return num_workers_; }
  int64_t staleness() const { return staleness_; }

 private:
  // True once a wait of `worker` for `step` has its answer: the gate is
  // cancelled, the worker is unknown or removed, or it may start.
  bool Decided(int worker, int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int num_workers_;
  const int64_t staleness_;
  mutable absl::Mutex mu_;
  ClockTable table_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace bnps::staleness

#endif  // BNPS_STALENESS_STALENESS_GATE_H_
