// KeepAwake: keeps CPUs out of their idle state while messages keep coming,
// so that the thread answering the next message wakes by a context switch
// rather than by waking a CPU from idle. On a virtual machine a halted vCPU
// takes tens of microseconds to wake (an exit to the hypervisor and an
// interrupt back); on bare metal a deep C-state costs alike. For a BN
// exchange that takes about 100 us that is a large share (docs/server.md).
//
// One thread per CPU it is given, pinned there, at SCHED_IDLE priority: any
// ordinary thread that wakes on that CPU preempts it at once, Linux places
// a waking thread on a CPU that runs only SCHED_IDLE work as if that CPU
// were idle, and the busy-wait calls sched_yield between short pauses, so
// an ordinary thread that yields (a lock's or gRPC's spin loop) gets the CPU
// back at once rather than at the next scheduler tick. Each Touch() keeps the threads busy-waiting (with the pause
// instruction) for `hold` after it; once `hold` passes without a Touch they
// sleep on a condition and cost nothing. So the CPUs are busy -- at idle
// priority -- only while traffic flows and for `hold` after it.
//
// Use it where the process has CPUs of its own (e.g. pinned with taskset or
// a container's cpuset): on CPUs shared with other work it takes only what
// they leave idle, but still draws power, and a busy hyperthread slows its
// sibling a little. Not under a CPU quota (a Kubernetes CPU limit without
// the static CPU manager): the spinning counts against the quota, and the
// whole process gets throttled; Start refuses then.
//
// Thread-safety: Touch may be called from any thread, concurrently; it takes
// no lock unless the threads sleep.

#ifndef BNPS_UTIL_KEEP_AWAKE_H_
#define BNPS_UTIL_KEEP_AWAKE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace bnps::util {

class KeepAwake {
 public:
  // Starts one thread per CPU of `cpus`, or of the calling thread's CPU
  // affinity mask (at start; later changes are not followed) if `cpus` is
  // empty. `hold` is capped at an hour. INVALID_ARGUMENT for `hold` <= 0 or
  // a CPU the caller may not run on; FAILED_PRECONDITION if the process has
  // a CPU quota (cgroup v2 cpu.max or v1 cpu.cfs_quota_us); INTERNAL if a thread cannot be pinned or given
  // SCHED_IDLE.
  static absl::StatusOr<std::unique_ptr<KeepAwake>> Start(
      absl::Duration hold, std::vector<int> cpus = {});
  ~KeepAwake();  // stops and joins the threads

  KeepAwake(const KeepAwake&) = delete;
  KeepAwake& operator=(const KeepAwake&) = delete;

  // A message came: keep the CPUs busy until `hold` from now.
  void Touch();

  // The CPUs kept, one thread each, in increasing order.
  const std::vector<int>& cpus() const { return cpus_; }
  // The Linux thread ids of the threads (for their scheduling policy).
  std::vector<int> thread_ids() const;
  // How long the threads have spent in their busy-wait, summed over them
  // (wall time: time they were preempted in it included).
  absl::Duration busy() const {
    return absl::Nanoseconds(busy_ns_.load(std::memory_order_relaxed));
  }
  // How many threads sleep now (waiting for a Touch).
  int sleeping() const { return sleeping_.load(std::memory_order_acquire); }

 private:
  KeepAwake(int64_t hold_ns, std::vector<int> cpus)
      : hold_ns_(hold_ns), cpus_(std::move(cpus)) {}
  void Run(int index);

  const int64_t hold_ns_;
  const std::vector<int> cpus_;
  // Until when (steady clock, ns) the threads busy-wait.
  std::atomic<int64_t> until_ns_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<int64_t> busy_ns_{0};
  std::vector<std::thread> threads_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Set by each thread once it is pinned and at SCHED_IDLE (or failed).
  std::vector<int> tids_ ABSL_GUARDED_BY(mu_);
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status start_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::util

#endif  // BNPS_UTIL_KEEP_AWAKE_H_
