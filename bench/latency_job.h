// One worker's part of a row of the BN latency table, and how the row's
// workers agree on when to stop. A Job is plain data that crosses a pipe to a
// worker process (worker_pool.h); RowControl lives in memory the row's
// processes share; CallPlan decides, call by call, whether a worker goes on.
// Each system's worker (bnps_peer.h, gloo_peer.h, echo_peer.h) runs a Job
// and returns the microseconds of its timed calls.
//
// Thread-safety: a Job and a CallPlan belong to one worker; RowControl's
// fields are atomics, read and written by every process of the row.

#ifndef BNPS_BENCH_LATENCY_JOB_H_
#define BNPS_BENCH_LATENCY_JOB_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/settings.h"
#include "bench/timing.h"

namespace bnps::bench {

// What a latency row measures.
enum class Peer : int { kBnps, kGloo, kEcho, kStar, kTcp };

// One worker's part of a latency row. Plain data: it crosses a pipe.
struct Job {
  Peer peer = Peer::kBnps;
  int rank = 0;
  int workers = 1;
  int channels = 0;
  int warmup = 0;
  int reps = 0;
  int min_reps = 0;
  int64_t row_time_ns = 0;  // see CallPlan
  int port = 0;             // bnps, echo, star, tcp: their server on 127.0.0.1
  int64_t deadline_ns = 0;  // steady clock: no call starts after it
  char dir[64] = {};        // gloo: the rendezvous directory
  int64_t bn_spin_ns = 0;   // bnps: the client's bn_spin
};

// What a row's worker processes share (memory mapped before the fork).
struct RowControl {
  // A worker failed or the row's deadline passed: the others stop at their
  // next call (gloo's ranks never stop early: a ring needs every rank for
  // every call).
  std::atomic<bool> stop{false};
  // No worker starts call `end` or later (see CallPlan).
  std::atomic<int> end{0};
};

// Runs `job` in the calling (worker) process: the worker's timed calls (us),
// or why it could not make them. `control` is the row's shared memory.
using JobRunner = absl::StatusOr<std::vector<double>> (*)(const Job& job,
                                                          RowControl* control);

// The Job of a row of `peer` with `channels` and `workers`, timed as `s`
// says; its deadline is s.row_budget from now. The caller sets the rank (the
// pool does), and the port or directory of the peer.
Job RowJob(Peer peer, int channels, int workers, const Settings& s);

// False once the row's worker must make no further call (and tells the
// others so, if it is the first to see the deadline).
bool KeepGoing(const Job& job, RowControl* control);

// How many calls a worker of a row makes: job.warmup, then job.reps timed
// ones, unless rank 0 ends the row sooner. Rank 0 does once it has timed
// job.min_reps calls and job.row_time_ns has passed since its first timed
// call: it sets the end two calls past the one it just finished. In a row
// whose workers wait for each other every call (bnps, star, gloo) no worker
// has then started a call beyond the next one, so all make the same number of
// calls and none is left waiting; echo workers, independent, stop at their
// next call. Rows are so timed for a similar time whatever their speed:
// enough calls for fast rows to be steady, and slow ones still bounded.
class CallPlan {
 public:
  // `job` and `control` are not owned and must outlive the plan.
  CallPlan(const Job& job, RowControl* control)
      : job_(job), control_(control) {}

  // Whether call i may start.
  bool MayStart(int i);

  // After call i has completed.
  void Finished(int i);

 private:
  const Job& job_;
  RowControl* const control_;
  Clock::time_point timed_since_;
};

}  // namespace bnps::bench

#endif  // BNPS_BENCH_LATENCY_JOB_H_
