#include "bench/latency_job.h"

#include <chrono>

#include "absl/time/time.h"

namespace bnps::bench {

Job RowJob(Peer peer, int channels, int workers, const Settings& s) {
  Job job;
  job.peer = peer;
  job.workers = workers;
  job.channels = channels;
  job.warmup = s.warmup;
  job.reps = s.reps;
  job.min_reps = s.min_reps;
  job.row_time_ns = absl::ToInt64Nanoseconds(s.row_time);
  job.bn_spin_ns = absl::ToInt64Nanoseconds(s.bn_spin);
  job.deadline_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        (Clock::now() + absl::ToChronoNanoseconds(s.row_budget))
                            .time_since_epoch())
                        .count();
  return job;
}

bool KeepGoing(const Job& job, RowControl* control) {
  if (control->stop.load()) return false;
  if (Clock::now().time_since_epoch() >=
      std::chrono::nanoseconds(job.deadline_ns)) {
    control->stop.store(true);
    return false;
  }
  return true;
}

bool CallPlan::MayStart(int i) {
  if (i >= control_->end.load()) return false;
  if (i == job_.warmup) timed_since_ = Clock::now();
  return true;
}

void CallPlan::Finished(int i) {
  if (job_.rank != 0 || i + 1 < job_.warmup + job_.min_reps) return;
  if (Clock::now() - timed_since_ <
      std::chrono::nanoseconds(job_.row_time_ns)) {
    return;
  }
  if (i + 2 < control_->end.load()) control_->end.store(i + 2);
}

}  // namespace bnps::bench
