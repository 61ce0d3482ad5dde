#include "bench/worker_pool.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/pipe_io.h"

namespace bnps::bench {

absl::StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Fork(int n,
                                                             JobRunner run) {
  static_assert(std::atomic<bool>::is_always_lock_free &&
                std::atomic<int>::is_always_lock_free);
  std::unique_ptr<WorkerPool> pool(new WorkerPool());
  void* shared = mmap(nullptr, sizeof(RowControl), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap: ", strerror(errno)));
  }
  pool->control_ = new (shared) RowControl();
  const pid_t parent = getpid();
  std::fflush(nullptr);
  for (int i = 0; i < n; ++i) {
    int jobs[2], results[2];
    if (pipe2(jobs, O_CLOEXEC) != 0) {
      return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
    }
    if (pipe2(results, O_CLOEXEC) != 0) {
      close(jobs[0]);
      close(jobs[1]);
      return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
    }
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // it died before prctl
      close(jobs[1]);
      close(results[0]);
      for (const Child& c : pool->children_) {
        close(c.to);
        close(c.from);
      }
      Serve(jobs[0], results[1], pool->control_, run);
    }
    close(jobs[0]);
    close(results[1]);
    if (pid < 0) {
      close(jobs[1]);
      close(results[0]);
      return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
    }
    pool->children_.push_back({pid, jobs[1], results[0]});
  }
  return pool;
}

WorkerPool::~WorkerPool() {
  // Closing the job pipes ends the children; wait a little, then kill.
  for (Child& c : children_) close(c.to);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (Child& c : children_) {
    while (waitpid(c.pid, nullptr, WNOHANG) == 0) {
      if (absl::Now() >= deadline) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, nullptr, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    close(c.from);
  }
  if (control_ != nullptr) munmap(control_, sizeof(RowControl));
}

void WorkerPool::Serve(int jobs, int results, RowControl* control,
                       JobRunner run) {
  Job job;
  while (ReadFull(jobs, &job, sizeof(job), absl::InfiniteFuture())) {
    const absl::StatusOr<std::vector<double>> us = run(job, control);
    Result r;
    if (us.ok()) {
      r.samples = static_cast<int>(us->size());
    } else {
      r.code = static_cast<int>(us.status().code());
      std::snprintf(r.error, sizeof(r.error), "worker %d: %s", job.rank,
                    std::string(us.status().message()).c_str());
    }
    if (!WriteFull(results, &r, sizeof(r)) ||
        (us.ok() &&
         !WriteFull(results, us->data(), us->size() * sizeof(double)))) {
      _exit(2);
    }
  }
  _exit(0);
}

absl::StatusOr<Latency> WorkerPool::Run(Job job) {
  if (job.workers > static_cast<int>(children_.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("the pool has ", children_.size(), " worker processes"));
  }
  control_->stop.store(false);
  control_->end.store(job.warmup + job.reps);
  for (int rank = 0; rank < job.workers; ++rank) {
    job.rank = rank;
    if (!WriteFull(children_[rank].to, &job, sizeof(job))) {
      Kill();
      return absl::InternalError("a worker process is gone");
    }
  }
  const absl::Time deadline =
      absl::Now() + kWaitPastDeadline +
      absl::FromChrono(std::chrono::nanoseconds(job.deadline_ns) -
                       Clock::now().time_since_epoch());
  std::vector<std::vector<double>> us(job.workers);
  absl::Status status;
  for (int rank = 0; rank < job.workers; ++rank) {
    Result r;
    bool read = ReadFull(children_[rank].from, &r, sizeof(r), deadline) &&
                r.samples >= 0 && r.samples <= job.warmup + job.reps;
    if (read) {
      us[rank].resize(r.samples);
      read = ReadFull(children_[rank].from, us[rank].data(),
                      us[rank].size() * sizeof(double), deadline);
    }
    if (!read) {
      Kill();
      return absl::DeadlineExceededError(
          absl::StrCat("worker process ", rank, " sent no result within ",
                       absl::FormatDuration(kWaitPastDeadline),
                       " after the row's deadline; the pool was killed"));
    }
    r.error[sizeof(r.error) - 1] = '\0';
    if (r.code != 0 && status.ok()) {
      status = absl::Status(static_cast<absl::StatusCode>(r.code), r.error);
    }
  }
  if (!status.ok()) return status;
  return Summarize(us);
}

void WorkerPool::Kill() {
  for (Child& c : children_) {
    kill(c.pid, SIGKILL);
    waitpid(c.pid, nullptr, 0);
    close(c.to);
    close(c.from);
  }
  children_.clear();
}

}  // namespace bnps::bench
