#include "staleness/staleness_gate.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace bnps::staleness {

absl::StatusOr<std::unique_ptr<StalenessGate>> StalenessGate::Create(
    int num_workers, int64_t staleness) {
  absl::StatusOr<ClockTable> table = ClockTable::Create(num_workers, staleness);
  if (!table.ok()) return table.status();
  return std::make_unique<StalenessGate>(*std::move(table));
}

StalenessGate::StalenessGate(ClockTable table)
    : num_workers_(table.num_workers()),
      staleness_(table.staleness()),
      table_(std::move(table)) {}

absl::Status StalenessGate::Advance(int worker, int64_t completed) {
  absl::MutexLock lock(&mu_);  // waiters re-check their condition on unlock
  return table_.Advance(worker, completed);
}

absl::Status StalenessGate::Remove(int worker) {
  absl::MutexLock lock(&mu_);
  return table_.Remove(worker);
}

bool StalenessGate::Decided(int worker, int64_t step) const {
  return cancelled_ || !table_.IsLive(worker) || table_.MayStart(worker, step);
}

absl::Status StalenessGate::WaitToStart(int worker, int64_t step,
                                        absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  // Conditions run with mu_ held, by this thread or by the one unlocking mu_.
  auto decided = [this, worker, step]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return Decided(worker, step);
  };
  if (!decided()) mu_.AwaitWithDeadline(absl::Condition(&decided), deadline);

  if (cancelled_) {
    return absl::CancelledError(
        absl::StrCat("wait: worker ", worker, " step ", step, ": gate cancelled"));
  }
  if (!table_.IsValidWorker(worker)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wait: unknown worker ", worker, " (", num_workers_, " workers)"));
  }
  if (!table_.IsLive(worker)) {
    return absl::FailedPreconditionError(
        absl::StrCat("wait: worker ", worker, " step ", step, ": worker removed"));
  }
  if (table_.MayStart(worker, step)) return absl::OkStatus();

  std::string blockers;
  for (int w : table_.Laggards(step)) {
    absl::StrAppend(&blockers, blockers.empty() ? "" : ", ", "worker ", w,
                    " at clock ", table_.clock(w));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "wait: worker ", worker, " may not begin step ", step, " (staleness ",
      staleness_, ") by the deadline; blocked by ", blockers));
}

void StalenessGate::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

bool StalenessGate::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool StalenessGate::MayStart(int worker, int64_t step) const {
  absl::MutexLock lock(&mu_);
  return table_.MayStart(worker, step);
}

int64_t StalenessGate::MinLiveClock() const {
  absl::MutexLock lock(&mu_);
  return table_.MinLiveClock();
}

int64_t StalenessGate::clock(int worker) const {
  absl::MutexLock lock(&mu_);
  return table_.clock(worker);
}

bool StalenessGate::IsLive(int worker) const {
  absl::MutexLock lock(&mu_);
  return table_.IsLive(worker);
}

int StalenessGate::num_live() const {
  absl::MutexLock lock(&mu_);
  return table_.num_live();
}

ClockTable StalenessGate::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return table_;
}

bool StalenessGate::Admissible(int64_t contribution_clock, int64_t step) const {
  absl::MutexLock lock(&mu_);
  return table_.Admissible(contribution_clock, step);
}

}  // namespace bnps::staleness
