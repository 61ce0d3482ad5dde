#include "server/membership.h"

#include "absl/strings/str_cat.h"
#include "proto/generation.h"

namespace bnps::server {

Membership::Membership(int num_workers, absl::Duration heartbeat_timeout)
    : timeout_(heartbeat_timeout),
      workers_(num_workers),
      restored_(num_workers, false),
      addresses_(num_workers),
      told_(num_workers) {}

absl::Status Membership::Check(int worker, uint64_t incarnation) const {
  if (worker < 0 || worker >= static_cast<int>(workers_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " outside the job's [0, ", workers_.size(), ")"));
  }
  if (incarnation == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker,
                     " sent no incarnation (a nonzero id of its process)"));
  }
  if (workers_[worker].lost) {
    return absl::FailedPreconditionError(
        absl::StrCat(LostTextLocked(worker), ": the job dropped it"));
  }
  return absl::OkStatus();
}

absl::Status Membership::Register(int worker, uint64_t incarnation,
                                  absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Check(worker, incarnation); !s.ok()) return s;
  WorkerInfo& info = workers_[worker];
  if (info.finished) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker, " ", proto::kFinishedText,
        " already; it cannot join again"));
  }
  if (info.registered && info.incarnation != incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker,
                     " is already registered by another live process "
                     "(last heard from ",
                     absl::FormatDuration(absl::Trunc(now - info.last_seen,
                                                      absl::Milliseconds(1))),
                     " ago): is worker ", worker,
                     " launched twice? A restart may "
                     "register once that process is lost (silent for ",
                     absl::FormatDuration(timeout_), ")"));
  }
  info.registered = true;
  info.incarnation = incarnation;
  info.last_seen = now;
  restored_[worker] = false;
  told_[worker] = Loss();
  return absl::OkStatus();
}

absl::Status Membership::Replace(int worker, uint64_t incarnation,
                                 absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (worker < 0 || worker >= static_cast<int>(workers_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", worker, " outside the job"));
  }
  if (incarnation == 0) return absl::InvalidArgumentError("incarnation 0");
  WorkerInfo& info = workers_[worker];
  info.registered = true;
  info.lost = false;
  info.finished = false;
  info.incarnation = incarnation;
  info.last_seen = now;
  restored_[worker] = false;
  told_[worker] = Loss();
  return absl::OkStatus();
}

absl::Status Membership::Finish(int worker, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Check(worker, incarnation); !s.ok()) return s;
  WorkerInfo& info = workers_[worker];
  if (!info.registered || info.incarnation != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker, " said it finished from a process that does not "
        "run it (not registered, or another process registered)"));
  }
  info.finished = true;
  return absl::OkStatus();
}

void Membership::Restore(const std::vector<WorkerInfo>& workers,
                         absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (workers.size() != workers_.size()) return;
  for (size_t w = 0; w < workers.size(); ++w) {
    workers_[w] = workers[w];
    workers_[w].last_seen = workers[w].registered ? now : absl::InfinitePast();
    restored_[w] = true;
    told_[w] = Loss();
  }
  marked_.clear();
}

absl::Status Membership::Rejoin(int worker, uint64_t incarnation,
                                absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!IsLostLocked(worker)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker, " is not lost"));
  }
  if (incarnation == 0) {
    return absl::InvalidArgumentError("incarnation 0");
  }
  WorkerInfo& info = workers_[worker];
  info.lost = false;
  info.incarnation = incarnation;
  info.last_seen = now;
  restored_[worker] = false;
  told_[worker] = Loss();
  return absl::OkStatus();
}

absl::Status Membership::Heartbeat(int worker, uint64_t incarnation,
                                   absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (worker >= 0 && worker < static_cast<int>(workers_.size()) &&
      incarnation != 0 && restored_[worker] &&
      (!workers_[worker].registered ||
       workers_[worker].incarnation != incarnation)) {
    // The record is a checkpoint's: this process may have registered after
    // it was taken (a worker restarted, then this server). Not final: the
    // process registers again when the job rolls back.
    return absl::AbortedError(absl::StrCat(
        "worker ", worker, ": this server restarted from a checkpoint taken "
        "before this process registered; it registers again when the job "
        "rolls back"));
  }
  if (absl::Status s = Check(worker, incarnation); !s.ok()) return s;
  WorkerInfo& info = workers_[worker];
  if (!info.registered) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker, " heartbeats before registering"));
  }
  if (info.incarnation != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker, " is now run by another process (it registered ",
        "after this one was lost)"));
  }
  info.last_seen = now;
  return absl::OkStatus();
}

std::vector<int> Membership::CheckTimeouts(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<int> lost;
  lost.swap(marked_);
  for (size_t w = 0; w < workers_.size(); ++w) {
    WorkerInfo& info = workers_[w];
    if (info.registered && !info.lost && !info.finished &&
        now - info.last_seen > timeout_) {
      info.lost = true;
      lost.push_back(static_cast<int>(w));
    }
  }
  return lost;
}

bool Membership::MarkLost(int worker, uint64_t incarnation, int shard,
                          std::string reason, std::string seal) {
  absl::MutexLock lock(&mu_);
  if (worker < 0 || worker >= static_cast<int>(workers_.size()) ||
      incarnation == 0) {
    return false;
  }
  WorkerInfo& info = workers_[worker];
  if (!info.registered || info.lost || info.finished ||
      info.incarnation != incarnation) {
    return false;
  }
  info.lost = true;
  told_[worker] =
      Loss{worker, incarnation, shard, std::move(reason), std::move(seal)};
  marked_.push_back(worker);
  return true;
}

std::vector<Membership::Loss> Membership::Losses() const {
  absl::MutexLock lock(&mu_);
  std::vector<Loss> losses;
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (!workers_[w].lost) continue;
    if (told_[w].shard >= 0) {
      losses.push_back(told_[w]);
    } else {
      losses.push_back(Loss{static_cast<int>(w), workers_[w].incarnation, -1,
                            LostTextLocked(static_cast<int>(w)), ""});
    }
  }
  return losses;
}

std::vector<Membership::WorkerInfo> Membership::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return workers_;
}

std::vector<int> Membership::LiveWorkers() const {
  absl::MutexLock lock(&mu_);
  std::vector<int> live;
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (workers_[w].registered && !workers_[w].lost && !workers_[w].finished) {
      live.push_back(w);
    }
  }
  return live;
}

bool Membership::IsLost(int worker) const {
  absl::MutexLock lock(&mu_);
  return IsLostLocked(worker);
}

bool Membership::IsRegistered(int worker) const {
  absl::MutexLock lock(&mu_);
  return worker >= 0 && worker < static_cast<int>(workers_.size()) &&
         workers_[worker].registered;
}

bool Membership::IsLostLocked(int worker) const {
  return worker >= 0 && worker < static_cast<int>(workers_.size()) &&
         workers_[worker].lost;
}

std::string Membership::LostText(int worker) const {
  absl::MutexLock lock(&mu_);
  return LostTextLocked(worker);
}

std::string Membership::LostTextLocked(int worker) const {
  if (worker >= 0 && worker < static_cast<int>(told_.size()) &&
      told_[worker].shard >= 0) {
    return absl::StrCat("shard ", told_[worker].shard, " found that ",
                        told_[worker].reason);
  }
  const bool known = worker >= 0 &&
                     worker < static_cast<int>(addresses_.size()) &&
                     !addresses_[worker].empty();
  return absl::StrCat("worker ", worker, " was lost (no heartbeat for ",
                      absl::FormatDuration(timeout_),
                      known ? "; last heard from " : "",
                      known ? addresses_[worker] : "", ")");
}

void Membership::SetAddress(int worker, std::string address) {
  absl::MutexLock lock(&mu_);
  if (worker < 0 || worker >= static_cast<int>(addresses_.size())) return;
  addresses_[worker] = std::move(address);
}

}  // namespace bnps::server
