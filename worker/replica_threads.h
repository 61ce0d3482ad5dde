// The threads of a replicated worker's models 1 .. k-1 (worker/trainer.h,
// --replicas), alive for a whole run: a thread per step would also rebuild
// its OpenMP pool every step. Run(fn) runs fn(i) on thread i for every
// i >= 1 while the caller runs fn(0), and returns when all are done.
//
// Thread-safety: Run from one thread at a time; the destructor stops and
// joins the threads (not while Run is in progress).

#ifndef BNPS_WORKER_REPLICA_THREADS_H_
#define BNPS_WORKER_REPLICA_THREADS_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace bnps::worker {

class ReplicaThreads {
 public:
  ReplicaThreads(int k, std::function<void(int)> init) {
    for (int i = 1; i < k; ++i) {
      threads_.emplace_back([this, i, init] {
        if (init) init(i);
        Loop(i);
      });
    }
  }
  ~ReplicaThreads() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }

  // fn(i) on thread i for i >= 1 while the caller runs fn(0); returns when
  // all are done.
  void Run(const std::function<void(int)>& fn) {
    {
      absl::MutexLock lock(&mu_);
      fn_ = &fn;
      done_ = 0;
      ++generation_;
    }
    fn(0);
    absl::MutexLock lock(&mu_);
    const int others = static_cast<int>(threads_.size());
    auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return done_ == others;
    };
    mu_.Await(absl::Condition(&all_done));
    fn_ = nullptr;
  }

 private:
  void Loop(int i) {
    int64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* fn;
      {
        absl::MutexLock lock(&mu_);
        auto work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || generation_ != seen;
        };
        mu_.Await(absl::Condition(&work));
        if (stop_) return;
        seen = generation_;
        fn = fn_;
      }
      (*fn)(i);
      absl::MutexLock lock(&mu_);
      ++done_;
    }
  }

  absl::Mutex mu_;
  const std::function<void(int)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace bnps::worker

#endif  // BNPS_WORKER_REPLICA_THREADS_H_
