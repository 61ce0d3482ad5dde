// WorkerClaims: which workers hold a live BN connection of one transport
// (per-worker tokens: a second live connection for the same worker is
// refused, so a stolen or copied worker token cannot run beside its
// worker). Internal to server/.
//
// A claim is of the job generation its connection was opened for. After a
// rollback the worker opens a new connection for the new generation while
// the server may still be ending the old one (its close and the new opening
// race): a claim for the shard's current generation supersedes a claim of
// an older one. The superseded connection keeps running until it ends, but
// every request it carries is of a past generation, which the shard refuses
// (Shard::CheckGeneration), and its Release leaves the newer claim alone.
// A second token holder gains nothing by it: it can supersede only a
// connection that can no longer act, and once it holds the current
// generation's claim the worker's own new connection is refused as before.
//
// Thread-safety: thread-safe.

#ifndef BNPS_SERVER_WORKER_CLAIMS_H_
#define BNPS_SERVER_WORKER_CLAIMS_H_

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace bnps::server {

class WorkerClaims {
 public:
  // A connection's claim on `worker`, opened for job generation
  // `generation` while the shard is in `current`. Granted (a claim id,
  // above 0) if the worker holds no live claim, or holds one of a
  // generation older than `generation` and `generation` is `current`;
  // else 0, and *held (if not null) is the live claim's generation.
  uint64_t Claim(int worker, int64_t generation, int64_t current,
                 int64_t* held = nullptr) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto [it, fresh] = live_.try_emplace(worker);
    if (!fresh && !(it->second.generation < generation &&
                    generation == current)) {
      if (held != nullptr) *held = it->second.generation;
      return 0;
    }
    it->second = {generation, ++last_id_};
    return last_id_;
  }
  // The connection holding claim `id` on `worker` ended; a claim that was
  // superseded since frees nothing.
  void Release(int worker, uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(worker);
    if (it != live_.end() && it->second.id == id) live_.erase(it);
  }

 private:
  struct Held {
    int64_t generation = 0;
    uint64_t id = 0;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<int, Held> live_ ABSL_GUARDED_BY(mu_);
  uint64_t last_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_WORKER_CLAIMS_H_
