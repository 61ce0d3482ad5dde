#include "server/step_clocks.h"

#include <algorithm>

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace bnps::server {

absl::StatusOr<std::unique_ptr<StepClocks>> StepClocks::Create(
    int num_workers, int64_t staleness) {
  absl::StatusOr<staleness::ClockTable> table =
      staleness::ClockTable::Create(num_workers, staleness);
  if (!table.ok()) return table.status();
  return std::unique_ptr<StepClocks>(new StepClocks(*std::move(table)));
}

StepClocks::StepClocks(staleness::ClockTable table)
    : table_(std::move(table)), failed_(table_.num_workers()) {}

std::string StepClocks::LaggardText(int64_t step) const {
  std::vector<std::string> parts;
  for (int w : table_.Laggards(step)) {
    parts.push_back(absl::StrCat("worker ", w, " at clock ", table_.clock(w)));
  }
  return absl::StrJoin(parts, ", ");
}

void StepClocks::Collect(Ready* ready) {
  util::TakeAnswered(
      &waiters_,
      [this](const Waiter& w) -> std::optional<absl::StatusOr<int64_t>> {
        if (!table_.IsLive(w.worker)) {
          return absl::FailedPreconditionError(
              absl::StrCat("worker ", w.worker, " was removed from the job"));
        }
        if (table_.MayStart(w.worker, w.step)) return table_.MinLiveClock();
        absl::Status why;
        for (int laggard : table_.Laggards(w.step)) {
          if (!failed_[laggard].ok()) why = failed_[laggard];
        }
        if (!why.ok()) return why;
        return std::nullopt;
      },
      ready);
}

void StepClocks::StartStep(int worker, int64_t step, absl::Time deadline,
                             Done done) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (!table_.IsValidWorker(worker)) {
      ready.push_back([done = std::move(done), worker] {
        done(absl::InvalidArgumentError(
            absl::StrCat("worker ", worker, " outside the job")));
      });
    } else if (step < 0) {
      ready.push_back([done = std::move(done)] {
        done(absl::InvalidArgumentError("negative step"));
      });
    } else if (!failed_[worker].ok()) {
      ready.push_back(
          [done = std::move(done), why = failed_[worker]] { done(why); });
    } else {
      waiters_.push_back({worker, step, deadline, std::move(done)});
      Collect(&ready);
    }
  }
  for (auto& fn : ready) fn();
}

absl::Status StepClocks::FinishStep(int worker, int64_t completed) {
  Ready ready;
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    if (table_.IsValidWorker(worker) && !failed_[worker].ok()) {
      return failed_[worker];  // the job dropped it: its clock stays
    }
    if (restored_ && table_.IsValidWorker(worker) &&
        completed < table_.clock(worker)) {
      return absl::OkStatus();  // a step replayed after a rollback
    }
    s = table_.Advance(worker, completed);
    if (s.ok()) Collect(&ready);
  }
  for (auto& fn : ready) fn();
  return s;
}

void StepClocks::RemoveWorker(int worker) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (!table_.Remove(worker).ok()) return;
    Collect(&ready);
  }
  for (auto& fn : ready) fn();
}

void StepClocks::FailWorker(int worker, absl::Status why) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (!table_.IsValidWorker(worker)) return;
    failed_[worker] = std::move(why);
    Collect(&ready);
  }
  for (auto& fn : ready) fn();
}

absl::Status StepClocks::RestoreWorker(int worker) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = table_.Restore(worker); !s.ok()) return s;
  failed_[worker] = absl::OkStatus();
  return absl::OkStatus();
}

absl::Status StepClocks::Restore(const std::vector<int64_t>& clocks,
                                 const absl::Status& why) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (clocks.size() != static_cast<size_t>(table_.num_workers())) {
      return absl::InvalidArgumentError("checkpointed clocks of another job");
    }
    absl::StatusOr<staleness::ClockTable> fresh =
        staleness::ClockTable::Create(table_.num_workers(), table_.staleness());
    if (!fresh.ok()) return fresh.status();
    int64_t top = 0;
    for (int64_t c : clocks) {
      if (c < 0) return absl::InvalidArgumentError("negative checkpointed clock");
      top = std::max(top, c);
    }
    // Level by level, as the workers got there: the table checks the bound
    // at every step.
    for (int64_t level = 1; level <= top; ++level) {
      for (int w = 0; w < table_.num_workers(); ++w) {
        if (clocks[w] < level) continue;
        if (absl::Status s = fresh->Advance(w, level); !s.ok()) return s;
      }
    }
    for (int w = 0; w < table_.num_workers(); ++w) {
      if (!table_.IsLive(w)) {
        if (absl::Status s = fresh->Remove(w); !s.ok()) return s;
      }
    }
    table_ = *std::move(fresh);
    restored_ = true;
    util::TakeAnswered(
        &waiters_,
        [&](const Waiter&) -> std::optional<absl::StatusOr<int64_t>> {
          return absl::StatusOr<int64_t>(why);
        },
        &ready);
  }
  for (auto& fn : ready) fn();
  return absl::OkStatus();
}

void StepClocks::ExpireDeadlines(absl::Time now) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    util::TakeAnswered(
        &waiters_,
        [&](const Waiter& w) -> std::optional<absl::StatusOr<int64_t>> {
          if (w.deadline > now) return std::nullopt;
          return absl::DeadlineExceededError(absl::StrCat(
              "worker ", w.worker, " may not begin step ", w.step,
              " (staleness ", table_.staleness(), "): waited for ",
              LaggardText(w.step)));
        },
        &ready);
  }
  for (auto& fn : ready) fn();
}

int64_t StepClocks::clock(int worker) const {
  absl::MutexLock lock(&mu_);
  return table_.clock(worker);
}

}  // namespace bnps::server
