// WorkerClaims: which workers hold a live BN connection of one transport
// (per-worker tokens: a second live connection for the same worker is
// refused, so a stolen or copied worker token cannot run beside its
// worker). Internal to server/.
//
// Thread-safety: thread-safe.

#ifndef BNPS_SERVER_WORKER_CLAIMS_H_
#define BNPS_SERVER_WORKER_CLAIMS_H_

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace bnps::server {

class WorkerClaims {
 public:
  // True if `worker` had no live connection; it has one now.
  bool Claim(int worker) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return live_.insert(worker).second;
  }
  // Its connection ended.
  void Release(int worker) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    live_.erase(worker);
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_set<int> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_WORKER_CLAIMS_H_
