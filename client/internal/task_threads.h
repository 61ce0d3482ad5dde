// Long-lived threads, one per index, each running the functions handed to
// it in order: a streaming pull (streaming_pull.h) runs one shard's call on
// that shard's thread every step instead of starting a thread per call.
// Internal to client/.
//
// Thread-safety: thread-safe. The destructor runs what is queued, then joins
// the threads; nothing may be handed over meanwhile.

#ifndef BNPS_CLIENT_INTERNAL_TASK_THREADS_H_
#define BNPS_CLIENT_INTERNAL_TASK_THREADS_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace bnps::client::internal {

class TaskThreads {
 public:
  // `n` threads, each started when it is first given something to run.
  explicit TaskThreads(int n);
  ~TaskThreads();

  TaskThreads(const TaskThreads&) = delete;
  TaskThreads& operator=(const TaskThreads&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // Runs `fn` on thread `i` (0 <= i < size()) after what it was given
  // before; returns at once.
  void Run(int i, std::function<void()> fn);

 private:
  struct Thread {
    absl::Mutex mu;
    std::deque<std::function<void()>> queue ABSL_GUARDED_BY(mu);
    bool stop ABSL_GUARDED_BY(mu) = false;
    std::thread thread;  // started by the first Run
  };
  static void Loop(Thread* t);

  absl::Mutex start_mu_;  // guards starting the threads
  std::vector<std::unique_ptr<Thread>> threads_;
};

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_TASK_THREADS_H_
