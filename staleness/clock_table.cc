#include "staleness/clock_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace bnps::staleness {

ClockTable::ClockTable(int num_workers, int64_t staleness)
    : staleness_(staleness),
      clocks_(num_workers, 0),
      live_(num_workers, true),
      num_live_(num_workers) {}

absl::StatusOr<ClockTable> ClockTable::Create(int num_workers,
                                              int64_t staleness) {
  if (num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("clock table: need at least one worker, got ", num_workers));
  }
  if (staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("clock table: negative staleness ", staleness));
  }
  return ClockTable(num_workers, staleness);
}

bool Admissible(int64_t contribution_clock, int64_t step, int64_t staleness) {
  // clock >= step - s; step - s can only underflow when it is below any clock.
  if (step < std::numeric_limits<int64_t>::min() + staleness) return true;
  return contribution_clock >= step - staleness;
}

bool ClockTable::WithinBound(int64_t clock, int64_t step) const {
  return staleness::Admissible(clock, step, staleness_);
}

absl::Status ClockTable::Advance(int worker, int64_t completed) {
  if (!IsValidWorker(worker)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "advance: unknown worker ", worker, " (", num_workers(), " workers)"));
  }
  if (completed < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "advance: worker ", worker, " reports negative clock ", completed));
  }
  if (!live_[worker]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "advance: worker ", worker, " was removed at clock ", clocks_[worker]));
  }
  if (completed < clocks_[worker]) {
    return absl::FailedPreconditionError(
        absl::StrCat("advance: worker ", worker, " reports clock ", completed,
                     " but is already at ", clocks_[worker]));
  }
  if (completed == clocks_[worker]) return absl::OkStatus();  // a retry
  // Completing step completed - 1 means the worker began it, which needed
  // MinLiveClock() >= completed - 1 - s (and the minimum never decreases).
  const int64_t min = MinLiveClock();
  if (!WithinBound(min, completed - 1)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "advance: worker ", worker, " reports clock ", completed,
        " but step ", completed - 1, " was never allowed: slowest live clock ",
        min, ", staleness ", staleness_));
  }
  clocks_[worker] = completed;
  return absl::OkStatus();
}

absl::Status ClockTable::Remove(int worker) {
  if (!IsValidWorker(worker)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "remove: unknown worker ", worker, " (", num_workers(), " workers)"));
  }
  if (live_[worker]) {
    live_[worker] = false;
    --num_live_;
  }
  return absl::OkStatus();
}

absl::Status ClockTable::Restore(int worker) {
  if (!IsValidWorker(worker)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "restore: unknown worker ", worker, " (", num_workers(), " workers)"));
  }
  if (live_[worker]) return absl::OkStatus();
  const int64_t min = MinLiveClock();
  if (num_live_ > 0 && clocks_[worker] < min) {
    return absl::FailedPreconditionError(
        absl::StrCat("restore: worker ", worker, " is at clock ",
                     clocks_[worker], " and the slowest live worker at ", min));
  }
  live_[worker] = true;
  ++num_live_;
  return absl::OkStatus();
}

bool ClockTable::MayStart(int worker, int64_t step) const {
  return IsLive(worker) && WithinBound(MinLiveClock(), step);
}

std::vector<int> ClockTable::Laggards(int64_t step) const {
  std::vector<int> laggards;
  for (int w = 0; w < num_workers(); ++w) {
    if (live_[w] && !WithinBound(clocks_[w], step)) laggards.push_back(w);
  }
  return laggards;
}

int64_t ClockTable::MinLiveClock() const {
  int64_t min = kNoLiveWorkers;
  for (int w = 0; w < num_workers(); ++w) {
    if (live_[w]) min = std::min(min, clocks_[w]);
  }
  return min;
}

int64_t ClockTable::clock(int worker) const {
  return IsValidWorker(worker) ? clocks_[worker] : -1;
}

bool ClockTable::IsLive(int worker) const {
  return IsValidWorker(worker) && live_[worker];
}

}  // namespace bnps::staleness
