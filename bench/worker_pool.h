// The worker processes of the BN latency table. They are forked when the
// benchmark starts, before this process has any thread or gRPC state, so that
// each can run gloo or gRPC clients of its own. Workers are processes in a
// deployment, and gloo's ranks must be; every system is measured the same
// way. A row hands the first W children a Job each over a pipe; each runs it
// with the JobRunner given at Fork and writes back its samples. A child exits
// when its pipe closes or this process dies.
//
// Example:
//   absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
//       WorkerPool::Fork(8, &RunLatencyJob);  // while single-threaded
//   ...
//   Job job = RowJob(Peer::kEcho, /*channels=*/64, /*workers=*/2, settings);
//   job.port = echo_server->port();
//   absl::StatusOr<Latency> latency = (*pool)->Run(job);
//
// Thread-safety: one thread uses a pool; Run is not reentrant.

#ifndef BNPS_BENCH_WORKER_POOL_H_
#define BNPS_BENCH_WORKER_POOL_H_

#include <sys/types.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/latency_job.h"
#include "bench/timing.h"

namespace bnps::bench {

class WorkerPool {
 public:
  // How long a row's workers have after its deadline to send their samples:
  // time for a call in flight to end at its barrier's timeout.
  static constexpr absl::Duration kWaitPastDeadline = absl::Seconds(40);

  // Forks `n` worker processes that run each job they are given with `run`.
  // INTERNAL if mmap, pipe or fork fails.
  // REQUIRES: this process has no threads.
  static absl::StatusOr<std::unique_ptr<WorkerPool>> Fork(int n, JobRunner run);
  // Ends the children: closes their pipes, then kills those still there
  // after 5 s.
  ~WorkerPool();

  // Runs `job` as ranks 0..job.workers-1 and summarizes their samples: the
  // first worker's error if one failed; FAILED_PRECONDITION if the pool has
  // fewer processes. If they are not all back kWaitPastDeadline after the
  // job's deadline, the children are killed, the pool is empty and every
  // later Run fails.
  absl::StatusOr<Latency> Run(Job job);

 private:
  struct Child {
    pid_t pid = -1;
    int to = -1;    // jobs
    int from = -1;  // results
  };
  // What a child writes back for a job, followed by `samples` doubles.
  struct Result {
    int code = 0;  // absl::StatusCode
    int samples = 0;
    char error[240] = {};
  };

  WorkerPool() = default;
  [[noreturn]] static void Serve(int jobs, int results, RowControl* control,
                                 JobRunner run);
  void Kill();

  std::vector<Child> children_;
  RowControl* control_ = nullptr;  // in memory shared with the children
};

}  // namespace bnps::bench

#endif  // BNPS_BENCH_WORKER_POOL_H_
