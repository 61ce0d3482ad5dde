// Which workers of the job registered and which still heartbeat.
//
// A registered worker that has not sent a heartbeat (or registered) for
// `heartbeat_timeout` is lost, for good: CheckTimeouts reports it once, and the
// shard then fails or drops it (server/shard.h). Workers that never registered
// are not lost; barriers that wait for them fail at their deadlines instead.
//
// Errors: INVALID_ARGUMENT for a worker id outside the job; FAILED_PRECONDITION
// for a heartbeat or registration of a lost worker.
// Thread-safety: thread-safe.

#ifndef BNPS_SERVER_MEMBERSHIP_H_
#define BNPS_SERVER_MEMBERSHIP_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace bnps::server {

class Membership {
 public:
  Membership(int num_workers, absl::Duration heartbeat_timeout);

  // Registering again (a retried call) is OK.
  absl::Status Register(int worker, absl::Time now);
  absl::Status Heartbeat(int worker, absl::Time now);

  // Workers that became lost since the last call.
  std::vector<int> CheckTimeouts(absl::Time now);

  struct WorkerInfo {
    bool registered = false;
    bool lost = false;
    absl::Time last_seen = absl::InfinitePast();
  };
  std::vector<WorkerInfo> Snapshot() const;
  std::vector<int> LiveWorkers() const;  // registered and not lost

 private:
  absl::Status Check(int worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  std::vector<WorkerInfo> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_MEMBERSHIP_H_
