#include "client/internal/task_threads.h"

#include <utility>

namespace bnps::client::internal {

TaskThreads::TaskThreads(int n) {
  for (int i = 0; i < n; ++i) threads_.push_back(std::make_unique<Thread>());
}

TaskThreads::~TaskThreads() {
  for (const std::unique_ptr<Thread>& t : threads_) {
    absl::MutexLock lock(&t->mu);
    t->stop = true;
  }
  for (const std::unique_ptr<Thread>& t : threads_) {
    if (t->thread.joinable()) t->thread.join();
  }
}

void TaskThreads::Run(int i, std::function<void()> fn) {
  Thread* t = threads_[i].get();
  {
    absl::MutexLock lock(&start_mu_);
    if (!t->thread.joinable()) t->thread = std::thread(Loop, t);
  }
  absl::MutexLock lock(&t->mu);
  t->queue.push_back(std::move(fn));
}

void TaskThreads::Loop(Thread* t) {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&t->mu);
      auto ready = [t]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu) {
        return t->stop || !t->queue.empty();
      };
      t->mu.Await(absl::Condition(&ready));
      if (t->queue.empty()) return;  // stopped, nothing left
      fn = std::move(t->queue.front());
      t->queue.pop_front();
    }
    fn();
  }
}

}  // namespace bnps::client::internal
