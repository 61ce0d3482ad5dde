// Which workers of the job registered, which process runs each, and which
// still heartbeat.
//
// Each registration names an incarnation: a random nonzero number the
// worker's process draws once, so that two processes launched with the same
// worker id are told apart. While a worker is live, only its incarnation may
// register again (a retry) or heartbeat.
//
// A registered worker that has not sent a heartbeat (or registered) for
// `heartbeat_timeout` is lost: CheckTimeouts reports it once, and the shard
// then fails or drops it (server/shard.h). Lost is final for Register and
// Heartbeat; only Rejoin, which the shard calls when its rule allows
// (Shard::Register), makes a lost worker live again. Workers that never
// registered are not lost; barriers that wait for them fail at their
// deadlines instead.
//
// A worker that finished the job (Finish: its process is done with every
// call) is never lost: it heartbeats no more. A finished worker may not
// register again (FAILED_PRECONDITION); its own process's late heartbeats
// are OK.
//
// Errors: INVALID_ARGUMENT for a worker id outside the job or incarnation 0;
// FAILED_PRECONDITION for a registration with another incarnation while the
// worker is live, a heartbeat from another incarnation or before
// registering, and a heartbeat or registration of a lost worker.
// Thread-safety: thread-safe.

#ifndef BNPS_SERVER_MEMBERSHIP_H_
#define BNPS_SERVER_MEMBERSHIP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace bnps::server {

class Membership {
 public:
  Membership(int num_workers, absl::Duration heartbeat_timeout);

  // Registers `worker` as run by `incarnation`. The same incarnation again
  // (a retried call) is OK.
  absl::Status Register(int worker, uint64_t incarnation, absl::Time now);
  // Makes a lost worker live again, run by `incarnation`.
  // FAILED_PRECONDITION unless it is lost.
  absl::Status Rejoin(int worker, uint64_t incarnation, absl::Time now);
  // Makes `incarnation` run `worker` in place of the one before, live or
  // lost (--on_worker_loss=wait: a restarted process). INVALID_ARGUMENT for
  // a bad id or incarnation 0.
  absl::Status Replace(int worker, uint64_t incarnation, absl::Time now);
  // FAILED_PRECONDITION (final for the process) for a lost worker, one not
  // registered, or another incarnation; but ABORTED while the worker's record
  // is a checkpoint's (Restore) and the process not registered since.
  absl::Status Heartbeat(int worker, uint64_t incarnation, absl::Time now);

  // `worker`, run by `incarnation`, finished the job. OK again for a retry;
  // FAILED_PRECONDITION for a lost worker, one not registered, or another
  // incarnation.
  absl::Status Finish(int worker, uint64_t incarnation);

  // Workers that became lost since the last call: silent for the timeout,
  // or marked by MarkLost.
  std::vector<int> CheckTimeouts(absl::Time now);

  // Marks `worker`, run by `incarnation`, lost on the word of shard `shard`
  // (`reason`, that shard's text; proto's WorkerLoss): the next
  // CheckTimeouts reports it, and LostText says "shard K found that
  // <reason>". False, changing nothing, unless the worker is registered,
  // live, unfinished and run by `incarnation`.
  // `seal` is kept with the news, to pass it on as it came.
  bool MarkLost(int worker, uint64_t incarnation, int shard,
                std::string reason, std::string seal = "");

  // A lost worker, and who found it lost: `shard` -1 for this membership's
  // own timeout (reason: its LostText; no seal), else MarkLost's shard,
  // reason and seal.
  struct Loss {
    int worker = -1;
    uint64_t incarnation = 0;
    int shard = -1;
    std::string reason;
    std::string seal;
  };
  // Every worker lost now (not since rejoined or replaced), by id.
  std::vector<Loss> Losses() const;

  struct WorkerInfo {
    bool registered = false;
    bool lost = false;
    uint64_t incarnation = 0;  // of the latest registration; 0 before any
    bool finished = false;     // finished the job (Finish)
    absl::Time last_seen = absl::InfinitePast();
  };
  std::vector<WorkerInfo> Snapshot() const;
  // Sets the registrations to `workers` (a checkpoint's; their last_seen is
  // ignored), as last seen `now`: the registered workers get a full
  // heartbeat_timeout to be heard from. Ignored unless of the job's size.
  void Restore(const std::vector<WorkerInfo>& workers, absl::Time now);
  // Registered, not lost and not finished.
  std::vector<int> LiveWorkers() const;
  // False for an id outside the job.
  bool IsLost(int worker) const;
  // Whether `worker` ever registered (lost or not; a checkpoint's record
  // counts). False for an id outside the job.
  bool IsRegistered(int worker) const;
  // "worker N was lost (no heartbeat for T; last heard from ADDRESS)": how
  // every refusal and log line names a lost worker (without the address
  // until one is known).
  std::string LostText(int worker) const;
  // Where `worker`'s calls come from (its host, e.g. "10.0.0.4"), for
  // LostText; the gRPC adapter sets it on each registration and heartbeat.
  // Ignored for an id outside the job.
  void SetAddress(int worker, std::string address);

 private:
  // INVALID_ARGUMENT for a bad id or incarnation; FAILED_PRECONDITION,
  // naming the worker, if it is lost.
  absl::Status Check(int worker, uint64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsLostLocked(int worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string LostTextLocked(int worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  std::vector<WorkerInfo> workers_ ABSL_GUARDED_BY(mu_);
  // By worker: its record is a checkpoint's (Restore), not yet confirmed by
  // a registration of this process's lifetime. A heartbeat of another
  // incarnation is then ABORTED, not final (FAILED_PRECONDITION): the worker
  // may have been restarted after the checkpoint was taken.
  std::vector<bool> restored_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);  // by worker
  // By worker: who found it lost, where MarkLost said (shard >= 0); reset
  // when it is live again.
  std::vector<Loss> told_ ABSL_GUARDED_BY(mu_);
  // Marked by MarkLost and not yet reported by CheckTimeouts.
  std::vector<int> marked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_MEMBERSHIP_H_
