#include "util/keep_awake.h"

#include <errno.h>
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "util/spin.h"

namespace bnps::util {
namespace {

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The CPU quota of the process's cgroup (v2 cpu.max or v1
// cpu.cfs_quota_us) as "<file> <value>", or "" if it has none (or it cannot
// be read). Under a quota a spinning thread is throttled with the rest.
std::string CpuQuota() {
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    // "0::/path" (cgroup v2) or "N:cpu,cpuacct:/path" (v1).
    const size_t a = line.find(':');
    const size_t b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (controllers.empty()) {
      const std::string max = ReadLine("/sys/fs/cgroup" + path + "/cpu.max");
      if (!max.empty() && max.rfind("max", 0) != 0) {
        return "cpu.max " + max;
      }
      continue;
    }
    for (const std::string& dir : {controllers, std::string("cpu")}) {
      const std::string quota =
          ReadLine("/sys/fs/cgroup/" + dir + path + "/cpu.cfs_quota_us");
      if (!quota.empty() && quota != "-1") {
        return "cpu.cfs_quota_us " + quota;
      }
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<KeepAwake>> KeepAwake::Start(
    absl::Duration hold, std::vector<int> cpus) {
  if (hold <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep-awake hold must be > 0, not ", absl::FormatDuration(hold)));
  }
  hold = std::min(hold, absl::Hours(1));  // no overflow in Touch
  if (const std::string quota = CpuQuota(); !quota.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "keep-awake: this process has a CPU quota (", quota,
        "): spinning, even at idle priority, would use it up and get the "
        "server throttled; give it whole CPUs (a cpuset) without a quota"));
  }
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) {
    return Errno("sched_getaffinity");
  }
  if (cpus.empty()) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &mask)) cpus.push_back(cpu);
    }
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &mask)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "keep-awake: this process may not run on CPU ", cpu,
          " (not in its affinity mask)"));
    }
  }
  std::unique_ptr<KeepAwake> k(
      new KeepAwake(absl::ToInt64Nanoseconds(hold), std::move(cpus)));
  const int n = static_cast<int>(k->cpus_.size());
  {
    absl::MutexLock lock(&k->mu_);
    k->tids_.assign(n, 0);
  }
  k->threads_.reserve(n);
  for (int i = 0; i < n; ++i) {
    k->threads_.emplace_back([p = k.get(), i] { p->Run(i); });
  }
  absl::Status error;
  {
    absl::MutexLock lock(&k->mu_);
    k->mu_.Await(absl::Condition(
        +[](KeepAwake* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
          return p->started_ == static_cast<int>(p->cpus_.size());
        },
        k.get()));
    error = k->start_error_;
  }
  if (!error.ok()) return error;  // the destructor joins the threads
  return k;
}

KeepAwake::~KeepAwake() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  until_ns_.store(0, std::memory_order_seq_cst);  // ends any busy-wait
  for (std::thread& t : threads_) t.join();
}

void KeepAwake::Touch() {
  until_ns_.store(NowNs() + hold_ns_, std::memory_order_seq_cst);
  // A thread going to sleep counts itself before it checks until_ns_, and
  // this reads the count after the store: either the thread sees the new
  // time, or this sees it and wakes it (releasing mu_ makes absl::Mutex
  // evaluate the sleepers' conditions again).
  if (sleeping_.load(std::memory_order_seq_cst) > 0) {
    absl::MutexLock lock(&mu_);
  }
}

std::vector<int> KeepAwake::thread_ids() const {
  absl::MutexLock lock(&mu_);
  return tids_;
}

void KeepAwake::Run(int index) {
  absl::Status s;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpus_[index], &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    s = Errno(absl::StrCat("keep-awake: pinning a thread to CPU ",
                           cpus_[index]));
  }
  sched_param param{};
  param.sched_priority = 0;
  if (s.ok() && sched_setscheduler(0, SCHED_IDLE, &param) != 0) {
    s = Errno("keep-awake: sched_setscheduler(SCHED_IDLE)");
  }
  {
    absl::MutexLock lock(&mu_);
    tids_[index] = static_cast<int>(syscall(SYS_gettid));
    ++started_;
    if (!s.ok() && start_error_.ok()) {
      start_error_ = s;
      stop_ = true;
    }
  }
  if (!s.ok()) return;
  const auto awake_or_stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || until_ns_.load(std::memory_order_seq_cst) > NowNs();
  };
  for (;;) {
    int64_t now = NowNs();
    if (now < until_ns_.load(std::memory_order_acquire)) {
      const int64_t begin = now;
      do {
        for (int i = 0; i < 16; ++i) CpuRelax();
        // A thread of the process that yields (absl::Mutex and gRPC spin
        // with sched_yield) would otherwise wait for the next tick behind
        // this one: yielding hands the CPU straight back to it.
        sched_yield();
        now = NowNs();
      } while (now < until_ns_.load(std::memory_order_relaxed));
      busy_ns_.fetch_add(now - begin, std::memory_order_relaxed);
      continue;
    }
    sleeping_.fetch_add(1, std::memory_order_seq_cst);
    bool stop;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&awake_or_stop));
      stop = stop_;
    }
    sleeping_.fetch_sub(1, std::memory_order_release);
    if (stop) return;
  }
}

}  // namespace bnps::util
