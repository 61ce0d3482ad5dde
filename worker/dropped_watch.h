// DroppedWatch: ends a worker that the job dropped, without waiting for the
// call it is in.
//
// Once a server has dropped this worker (it refused a heartbeat: the worker
// was lost, or another process took its place), every later client call
// fails with that, and the trainer stops at its next call. A call already
// under way, though, waits for its answer or its deadline (up to
// --rpc_timeout_s, 60 s), which cannot change the outcome. While it lives,
// a DroppedWatch polls `dropped` (the client's heartbeat_stats().dropped)
// and, once it has said non-OK for `grace` without the watch being
// destroyed, calls `on_dropped` with it, once.
//
// Thread-safety: the callbacks run on the watch's own thread; `dropped`
// must be thread-safe. The destructor waits for that thread.

#ifndef BNPS_WORKER_DROPPED_WATCH_H_
#define BNPS_WORKER_DROPPED_WATCH_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace bnps::worker {

class DroppedWatch {
 public:
  struct Options {
    absl::Duration poll = absl::Milliseconds(200);
    absl::Duration grace = absl::Seconds(1);
  };

  DroppedWatch(std::function<absl::Status()> dropped,
               std::function<void(const absl::Status&)> on_dropped,
               Options options);
  DroppedWatch(std::function<absl::Status()> dropped,
               std::function<void(const absl::Status&)> on_dropped)
      : DroppedWatch(std::move(dropped), std::move(on_dropped), Options()) {}
  ~DroppedWatch();

  DroppedWatch(const DroppedWatch&) = delete;
  DroppedWatch& operator=(const DroppedWatch&) = delete;

 private:
  void Watch();

  const std::function<absl::Status()> dropped_;
  const std::function<void(const absl::Status&)> on_dropped_;
  const Options options_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is made
};

// bnps_worker's on_dropped: says "bnps_worker: <why>" on stderr and exits 1
// at once (the worker holds nothing that outlives it).
[[noreturn]] void ExitDropped(const absl::Status& why);

}  // namespace bnps::worker

#endif  // BNPS_WORKER_DROPPED_WATCH_H_
