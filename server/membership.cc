#include "server/membership.h"

#include "absl/strings/str_cat.h"

namespace bnps::server {

Membership::Membership(int num_workers, absl::Duration heartbeat_timeout)
    : timeout_(heartbeat_timeout), workers_(num_workers) {}

absl::Status Membership::Check(int worker) const {
  if (worker < 0 || worker >= static_cast<int>(workers_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " outside the job's [0, ", workers_.size(), ")"));
  }
  if (workers_[worker].lost) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker, " was lost (no heartbeat for ",
        absl::FormatDuration(timeout_), "); the job went on without it"));
  }
  return absl::OkStatus();
}

absl::Status Membership::Register(int worker, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Check(worker); !s.ok()) return s;
  workers_[worker].registered = true;
  workers_[worker].last_seen = now;
  return absl::OkStatus();
}

absl::Status Membership::Heartbeat(int worker, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Check(worker); !s.ok()) return s;
  if (!workers_[worker].registered) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker, " heartbeats before registering"));
  }
  workers_[worker].last_seen = now;
  return absl::OkStatus();
}

std::vector<int> Membership::CheckTimeouts(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<int> lost;
  for (size_t w = 0; w < workers_.size(); ++w) {
    WorkerInfo& info = workers_[w];
    if (info.registered && !info.lost && now - info.last_seen > timeout_) {
      info.lost = true;
      lost.push_back(static_cast<int>(w));
    }
  }
  return lost;
}

std::vector<Membership::WorkerInfo> Membership::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return workers_;
}

std::vector<int> Membership::LiveWorkers() const {
  absl::MutexLock lock(&mu_);
  std::vector<int> live;
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (workers_[w].registered && !workers_[w].lost) live.push_back(w);
  }
  return live;
}

}  // namespace bnps::server
