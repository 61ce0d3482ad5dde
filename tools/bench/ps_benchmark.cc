// ps_benchmark: bnps against peers measured in the same run on this machine
// (docs/design.md, "Performance -- how it is measured"). Everything runs on
// 127.0.0.1; the tables give absolute times and the ratio bnps / peer.
//
// 1. BN-sync round trip of one layer, C channels, W workers. Every system's
//    W workers are W processes, as in a deployment (and as gloo's ranks must
//    be): a pool forked when the benchmark starts, before this process has
//    any thread or gRPC state; each row hands them its work over pipes. The
//    systems of a row run one after another. bnps: one shard server (sync
//    policy) in this process; each worker has its own GrpcPsClient and calls
//    BnForward(layer, step, moments) back to back; each call returns after
//    the barrier. Peers with the same bytes per worker (a forward exchange
//    carries count + mean[C] + m2[C] = 16C + 8 bytes each way):
//      gloo  ring allreduce of 2C doubles (the sum / sum of squares of an
//            allreduce-based SyncBN) among the W processes, TCP transport.
//      echo  raw gRPC: each worker with its own channel and bidi stream,
//            writing 16C + 8 bytes and reading them back from an echo server
//            in this process built like the shard server (callback API). The
//            transport floor.
//      star  the same echo, except that the server answers a round only once
//            all W streams have sent theirs (the Gather method): the floor
//            under any barrier served over gRPC, bnps's minus the work.
//    Every worker times each of its calls after a warm-up, for --row_seconds
//    but at least --min_reps and at most --reps calls (CallPlan); a cell is
//    the largest over workers of the per-worker p50 (or p99).
//
// 2. Gradient push + pull, one worker, S shard servers: the tensor is split
//    into parameters of at most 1M floats; a rep is PushGradients(step) of all
//    of them (shared, as the trainer pushes) and PullParametersInto(step + 1)
//    (sync, one worker: applied at once; into the same buffers every rep, as
//    the echo's reader reuses its message). Peer: raw gRPC moving the same
//    bytes in 1 MiB messages, a client-streaming Upload then a
//    server-streaming Download, split over S echo servers in parallel as bnps
//    splits over shards. Each system's reps of a row run in a fresh process
//    (this binary again, with --grad_child) holding its servers and client,
//    so neither runs in the heap the other left; the rows are measured in
//    --rounds rounds with the two systems back to back, the first
//    alternating. Throughput is 2 * bytes / (median time of a rep); MB = 2^20
//    bytes.
//
// Run: bazel build -c opt //tools/bench:ps_benchmark &&
//      bazel-bin/tools/bench/ps_benchmark [--reps=1000] [--min_reps=100]
//      [--row_seconds=0.5] [--quick]
//      [--tables=bn,grad] [--systems=bnps,gloo,echo,star]
//      [--channels=64,256,1024]
//      [--workers=1,2,4,8]

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bn/moments.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "grpcpp/grpcpp.h"
#include "proto/limits.h"
#include "proto/sharding.h"
#include "server/server_runner.h"
#include "tools/bench/echo.grpc.pb.h"
#include "client/grpc_ps_client.h"

ABSL_FLAG(int, reps, 1000,
          "BN latency: the most timed calls per worker and row (a row stops "
          "earlier once it has --min_reps and has run --row_seconds)");
ABSL_FLAG(int, min_reps, 100,
          "BN latency: the fewest timed calls per worker and row");
ABSL_FLAG(double, row_seconds, 0.5,
          "BN latency: timing a row stops at the first call after this many "
          "seconds, once it has --min_reps calls");
ABSL_FLAG(int, rounds, 3,
          "how many times each row is measured, the rows and systems "
          "interleaved; a BN cell is the median over the rounds, a grad cell "
          "the median of all its reps (split over the rounds)");
ABSL_FLAG(bool, quick, false,
          "fewer reps: at most 50 BN calls per row, 1-3 push+pull reps");
ABSL_FLAG(std::vector<std::string>, systems,
          std::vector<std::string>({"bnps", "gloo", "echo", "star"}),
          "which systems to measure: bnps, gloo, echo, star (the grad table "
          "has bnps and echo); fewer to profile one alone");
ABSL_FLAG(std::vector<std::string>, channels,
          std::vector<std::string>({"64", "256", "1024"}),
          "BN latency: the layer widths C, one row group each");
ABSL_FLAG(std::vector<std::string>, workers,
          std::vector<std::string>({"1", "2", "4", "8"}),
          "BN latency: the worker counts W of each row group");
ABSL_FLAG(std::string, grad_child, "",
          "internal, set by the grad table: SYSTEM,MB,S,REPS measures one "
          "system's push + pull reps (bnps or echo) in this process, prints "
          "their times and exits");
ABSL_FLAG(std::string, tables, "bn,grad",
          "which tables to measure, comma-separated: bn (BN-sync latency), "
          "grad (gradient push + pull throughput)");

namespace bnps::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPayloadMB[] = {1, 16, 64};
constexpr int64_t kMB = 1 << 20;
constexpr int64_t kFloatsPerKey = 1 << 20;
constexpr int64_t kEchoChunkBytes = 1 << 20;

struct Settings {
  int warmup = 20;     // BN calls per worker before timing
  int reps = 1000;     // most BN calls timed per worker
  int min_reps = 100;  // fewest; between the two, the row's time decides
  absl::Duration row_time = absl::Milliseconds(500);
  int rounds = 3;  // measurements of each row (BN and grad)
  absl::Duration row_budget = absl::Seconds(20);  // per latency row and peer
  std::vector<int> channels;                      // C of the BN rows
  std::vector<int> workers;                       // W of the BN rows
  std::vector<int> shard_counts = {1, 2};
  // Which systems are measured (--systems); a skipped one's cells say so.
  bool bnps = true, gloo = true, echo = true, star = true;
  // By MB: about 2 s of each system per row. With a quarter of these (and
  // cells the median of so few reps) a row's ratio moved by 0.3 between runs.
  std::map<int, int> push_pull_reps = {{1, 160}, {16, 60}, {64, 36}};
};

struct Latency {
  double p50_us = 0;
  double p99_us = 0;
  int samples = 0;  // per worker (the fewest)
};

// The result of a system left out by --systems.
absl::Status Skipped() { return absl::CancelledError("not in --systems"); }

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Nearest-rank percentile, q in (0, 1]. REQUIRES: !v.empty().
double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * v.size()));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// The largest over workers of each worker's p50 and p99.
absl::StatusOr<Latency> Summarize(const std::vector<std::vector<double>>& us) {
  Latency l;
  l.samples = static_cast<int>(us[0].size());
  for (const std::vector<double>& w : us) {
    if (w.empty()) return absl::DeadlineExceededError("no call was timed");
    l.p50_us = std::max(l.p50_us, Percentile(w, 0.50));
    l.p99_us = std::max(l.p99_us, Percentile(w, 0.99));
    l.samples = std::min(l.samples, static_cast<int>(w.size()));
  }
  return l;
}

// Runs fn(i) for i in [0, n) on n threads and joins them.
template <typename Fn>
void OnThreads(int n, Fn fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([&fn, i] { fn(i); });
  for (std::thread& t : threads) t.join();
}

// --- the workers of a latency row: W processes, as in a deployment

// How long a row's workers have after its deadline to send their samples:
// time for a call in flight to end at its barrier's timeout.
constexpr absl::Duration kWaitPastDeadline = absl::Seconds(40);

// What a latency row measures.
enum class Peer : int { kBnps, kGloo, kEcho, kStar };

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
  int port = 0;             // bnps, echo, star: their server on 127.0.0.1
  int64_t deadline_ns = 0;  // steady clock: no call starts after it
  char dir[64] = {};        // gloo: the rendezvous directory
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

// Runs `job` in this process: the worker's timed calls (us), or why it could
// not make them.
absl::StatusOr<std::vector<double>> RunJob(const Job& job, RowControl* control);

// One read(2) of at most `n` bytes from `fd` once it is readable: the bytes
// read, 0 at the end of the pipe, -1 on an error or once `deadline` passed.
ssize_t ReadSome(int fd, void* data, size_t n, absl::Time deadline) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return -1;
    pollfd pfd{fd, POLLIN, 0};
    const int ms = static_cast<int>(
        std::min<int64_t>(absl::ToInt64Milliseconds(left), 1 << 30) + 1);
    const int ready = poll(&pfd, 1, ms);
    if (ready < 0 && errno != EINTR) return -1;
    if (ready <= 0) continue;
    const ssize_t got = read(fd, data, n);
    if (got < 0 && errno == EINTR) continue;
    return got;
  }
}

// Reads or writes all `n` bytes unless the pipe ends, fails or `deadline`
// passes first.
bool ReadFull(int fd, void* data, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ReadSome(fd, p, n, deadline);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool WriteFull(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

// Worker processes forked when the benchmark starts, before this process has
// any thread or gRPC state, so that each can run gloo or gRPC clients of its
// own. Workers are processes in a deployment, and gloo's ranks must be; every
// system is measured the same way. A row hands the first W children a Job
// each over a pipe and reads back their samples. A child exits when its pipe
// closes or this process dies.
class WorkerPool {
 public:
  // REQUIRES: this process has no threads.
  static absl::StatusOr<std::unique_ptr<WorkerPool>> Fork(int n);
  ~WorkerPool();

  // Runs `job` as ranks 0..workers-1 and summarizes their samples. If they are
  // not all back kWaitPastDeadline after the job's deadline, the children are
  // killed and the pool is empty.
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
  [[noreturn]] static void Serve(int jobs, int results, RowControl* control);
  void Kill();

  std::vector<Child> children_;
  RowControl* control_ = nullptr;  // in memory shared with the children
};

absl::StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Fork(int n) {
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
      Serve(jobs[0], results[1], pool->control_);
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

void WorkerPool::Serve(int jobs, int results, RowControl* control) {
  Job job;
  while (ReadFull(jobs, &job, sizeof(job), absl::InfiniteFuture())) {
    const absl::StatusOr<std::vector<double>> us = RunJob(job, control);
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

Job RowJob(Peer peer, int channels, int workers, const Settings& s) {
  Job job;
  job.peer = peer;
  job.workers = workers;
  job.channels = channels;
  job.warmup = s.warmup;
  job.reps = s.reps;
  job.min_reps = s.min_reps;
  job.row_time_ns = absl::ToInt64Nanoseconds(s.row_time);
  job.deadline_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        (Clock::now() + absl::ToChronoNanoseconds(s.row_budget))
                            .time_since_epoch())
                        .count();
  return job;
}

// False once the row's worker must make no further call (and tells the
// others so).
bool KeepGoing(const Job& job, RowControl* control) {
  if (control->stop.load()) return false;
  if (Clock::now().time_since_epoch() >=
      std::chrono::nanoseconds(job.deadline_ns)) {
    control->stop.store(true);
    return false;
  }
  return true;
}

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
  CallPlan(const Job& job, RowControl* control)
      : job_(job), control_(control) {}

  // Whether call i may start.
  bool MayStart(int i) {
    if (i >= control_->end.load()) return false;
    if (i == job_.warmup) timed_since_ = Clock::now();
    return true;
  }

  // After call i has completed.
  void Finished(int i) {
    if (job_.rank != 0 || i + 1 < job_.warmup + job_.min_reps) return;
    if (Clock::now() - timed_since_ <
        std::chrono::nanoseconds(job_.row_time_ns)) {
      return;
    }
    if (i + 2 < control_->end.load()) control_->end.store(i + 2);
  }

 private:
  const Job& job_;
  RowControl* const control_;
  Clock::time_point timed_since_;
};

// --- gloo

// Rank job.rank of job.workers: rendezvous through job.dir, time ring
// allreduces of 2 * channels doubles as the CallPlan says.
absl::StatusOr<std::vector<double>> GlooWorker(const Job& job,
                                               RowControl* control) {
  try {
    gloo::transport::tcp::attr attr("127.0.0.1");
    attr.ai_family = AF_INET;
    std::shared_ptr<gloo::transport::Device> device =
        gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(job.dir);
    auto context =
        std::make_shared<gloo::rendezvous::Context>(job.rank, job.workers);
    context->setTimeout(std::chrono::seconds(20));
    context->connectFullMesh(store, device);

    std::vector<double> data(2 * job.channels);
    gloo::AllreduceOptions options(context);
    options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    options.setOutput(data.data(), data.size());
    options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<double>));
    std::vector<double> us;
    CallPlan plan(job, control);
    for (int i = 0; plan.MayStart(i); ++i) {
      for (int c = 0; c < 2 * job.channels; ++c) data[c] = job.rank + 0.001 * c;
      const Clock::time_point t0 = Clock::now();
      gloo::allreduce(options);
      if (i >= job.warmup) us.push_back(MicrosSince(t0));
      plan.Finished(i);
    }
    // Keeps every rank's sockets open until all are done.
    gloo::BarrierOptions barrier(context);
    gloo::barrier(barrier);
    return us;
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

// gloo's ring allreduce among the pool's first `workers` processes.
absl::StatusOr<Latency> GlooLatency(WorkerPool& pool, int channels, int workers,
                                    const Settings& s) {
  Job job = RowJob(Peer::kGloo, channels, workers, s);
  const std::string dir =
      std::filesystem::temp_directory_path() / "bnps_bench_gloo_XXXXXX";
  if (dir.size() >= sizeof(job.dir)) {
    return absl::InternalError("the temporary directory's path is too long");
  }
  std::memcpy(job.dir, dir.c_str(), dir.size() + 1);
  if (mkdtemp(job.dir) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  absl::StatusOr<Latency> latency = pool.Run(job);
  std::error_code ignored;
  std::filesystem::remove_all(job.dir, ignored);
  return latency;
}

// --- raw gRPC peers

class EchoReactor : public grpc::ServerBidiReactor<Blob, Blob> {
 public:
  EchoReactor() { StartRead(&blob_); }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    StartWrite(&blob_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::CANCELLED);
    StartRead(&blob_);
  }
  void OnDone() override { delete this; }

 private:
  Blob blob_;
};

class GatherReactor;

// The groups of Gather streams waiting for their last member. A group is
// keyed by its size; the benchmark runs one group of each size at a time.
class GatherHall {
 public:
  // Holds `r` until its group is complete, then answers every member. False
  // if `r` was cancelled first: the caller finishes it.
  bool Arrive(GatherReactor* r);
  // From OnCancel: true if `r` was waiting (it no longer is; the caller
  // finishes it). Otherwise marks it, and Arrive will refuse it.
  bool Leave(GatherReactor* r);

 private:
  absl::Mutex mu_;
  std::map<int, std::vector<GatherReactor*>> waiting_ ABSL_GUARDED_BY(mu_);
};

class GatherReactor : public grpc::ServerBidiReactor<Blob, Blob> {
 public:
  explicit GatherReactor(GatherHall* hall) : hall_(hall) { StartRead(&blob_); }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    if (!hall_->Arrive(this)) Finish(grpc::Status::CANCELLED);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::CANCELLED);
    StartRead(&blob_);
  }
  // A cancelled call with no operation pending must still be finished.
  void OnCancel() override {
    if (hall_->Leave(this)) Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }

  void Answer() { StartWrite(&blob_); }
  int group() const { return std::max(1, blob_.group()); }

 private:
  friend class GatherHall;
  GatherHall* const hall_;
  Blob blob_;
  bool cancelled_ = false;  // guarded by the hall's mu_
};

bool GatherHall::Arrive(GatherReactor* r) {
  std::vector<GatherReactor*> go;
  {
    absl::MutexLock lock(&mu_);
    if (r->cancelled_) return false;
    std::vector<GatherReactor*>& group = waiting_[r->group()];
    group.push_back(r);
    if (static_cast<int>(group.size()) < r->group()) return true;
    go.swap(group);
  }
  for (GatherReactor* member : go) member->Answer();
  return true;
}

bool GatherHall::Leave(GatherReactor* r) {
  absl::MutexLock lock(&mu_);
  for (auto& [size, group] : waiting_) {
    auto it = std::find(group.begin(), group.end(), r);
    if (it != group.end()) {
      group.erase(it);
      return true;
    }
  }
  r->cancelled_ = true;
  return false;
}

class UploadReactor : public grpc::ServerReadReactor<Blob> {
 public:
  explicit UploadReactor(Count* response) : response_(response) {
    StartRead(&blob_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      response_->set_bytes(bytes_);
      return Finish(grpc::Status::OK);
    }
    bytes_ += blob_.data().size();
    StartRead(&blob_);
  }
  void OnDone() override { delete this; }

 private:
  Count* response_;
  Blob blob_;
  int64_t bytes_ = 0;
};

// What Downloads send: `bytes` of distinct memory, as a pull sends the
// store's values (not one buffer over and over, which stays in the cache).
// Filled once; replaced by a larger one when a larger download is asked for.
class DownloadSource {
 public:
  std::shared_ptr<const std::string> Get(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    if (source_ == nullptr || static_cast<int64_t>(source_->size()) < bytes) {
      source_ = std::make_shared<const std::string>(bytes, 'x');
    }
    return source_;
  }

 private:
  absl::Mutex mu_;
  std::shared_ptr<const std::string> source_ ABSL_GUARDED_BY(mu_);
};

class DownloadReactor : public grpc::ServerWriteReactor<Blob> {
 public:
  DownloadReactor(int64_t bytes, std::shared_ptr<const std::string> source)
      : bytes_(bytes), source_(std::move(source)) {
    WriteNext();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::CANCELLED);
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (sent_ >= bytes_) return Finish(grpc::Status::OK);
    const int64_t n = std::min(bytes_ - sent_, kEchoChunkBytes);
    chunk_.mutable_data()->assign(source_->data() + sent_, n);
    sent_ += n;
    StartWrite(&chunk_);
  }

  const int64_t bytes_;
  int64_t sent_ = 0;
  const std::shared_ptr<const std::string> source_;
  Blob chunk_;
};

class EchoServiceImpl final : public EchoService::CallbackService {
  grpc::ServerBidiReactor<Blob, Blob>* Echo(
      grpc::CallbackServerContext*) override {
    return new EchoReactor();
  }
  grpc::ServerBidiReactor<Blob, Blob>* Gather(
      grpc::CallbackServerContext*) override {
    return new GatherReactor(&hall_);
  }
  grpc::ServerReadReactor<Blob>* Upload(grpc::CallbackServerContext*,
                                        Count* response) override {
    return new UploadReactor(response);
  }
  grpc::ServerWriteReactor<Blob>* Download(grpc::CallbackServerContext*,
                                           const Count* request) override {
    const int64_t bytes = std::max<int64_t>(0, request->bytes());
    return new DownloadReactor(bytes, source_.Get(bytes));
  }

 private:
  GatherHall hall_;
  DownloadSource source_;
};

// A stub of the echo server on 127.0.0.1:port, with the shard server's
// message limits.
std::unique_ptr<EchoService::Stub> NewEchoStub(int port) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(proto::kMaxMessageBytes);
  args.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  return EchoService::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                grpc::InsecureChannelCredentials(), args));
}

// An echo server on 127.0.0.1 with the shard server's message limits.
class EchoServer {
 public:
  static absl::StatusOr<std::unique_ptr<EchoServer>> Start() {
    auto es = std::make_unique<EchoServer>();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &es->port_);
    builder.RegisterService(&es->service_);
    builder.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
    builder.SetMaxSendMessageSize(proto::kMaxMessageBytes);
    es->server_ = builder.BuildAndStart();
    if (es->server_ == nullptr || es->port_ == 0) {
      return absl::UnavailableError("cannot start the echo server");
    }
    return es;
  }
  ~EchoServer() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  int port() const { return port_; }
  std::unique_ptr<EchoService::Stub> NewStub() const {
    return NewEchoStub(port_);
  }

 private:
  EchoServiceImpl service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(60));
}

// A worker of the echo or star row: its own channel and stream, echoing
// 16 * channels + 8 bytes; in the star, every round is answered once all W
// have sent.
absl::StatusOr<std::vector<double>> EchoWorker(const Job& job,
                                               RowControl* control) {
  const bool gather = job.peer == Peer::kStar;
  std::unique_ptr<EchoService::Stub> stub = NewEchoStub(job.port);
  grpc::ClientContext context;
  SetDeadline(&context);
  auto stream = gather ? stub->Gather(&context) : stub->Echo(&context);
  Blob request, reply;
  request.mutable_data()->assign(16 * job.channels + 8, 'x');
  if (gather) request.set_group(job.workers);
  std::vector<double> us;
  CallPlan plan(job, control);
  for (int i = 0; plan.MayStart(i) && KeepGoing(job, control); ++i) {
    const Clock::time_point t0 = Clock::now();
    if (!stream->Write(request) || !stream->Read(&reply)) {
      control->stop.store(true);
      break;
    }
    if (i >= job.warmup) us.push_back(MicrosSince(t0));
    plan.Finished(i);
  }
  stream->WritesDone();
  absl::Status status = FromGrpc(stream->Finish(), "Echo");
  if (!status.ok()) return status;
  return us;
}

absl::StatusOr<Latency> EchoLatency(WorkerPool& pool, const EchoServer& server,
                                    int channels, int workers, bool gather,
                                    const Settings& s) {
  Job job = RowJob(gather ? Peer::kStar : Peer::kEcho, channels, workers, s);
  job.port = server.port();
  return pool.Run(job);
}

// Moves `bytes` up (Upload) and then down (Download), split over `stubs`, each
// direction in parallel over the stubs. Stub i uploads sources[i] (its share
// of the bytes: distinct memory, as a push sends the gradients' own).
absl::Status EchoPushPull(
    const std::vector<std::unique_ptr<EchoService::Stub>>& stubs,
    const std::vector<std::string>& sources) {
  const int n = static_cast<int>(stubs.size());
  std::vector<absl::Status> status(n);
  OnThreads(n, [&](int i) {
    grpc::ClientContext context;
    SetDeadline(&context);
    Count response;
    auto writer = stubs[i]->Upload(&context, &response);
    const std::string& source = sources[i];
    const int64_t size = static_cast<int64_t>(source.size());
    Blob chunk;
    for (int64_t sent = 0; sent < size; sent += kEchoChunkBytes) {
      chunk.mutable_data()->assign(source.data() + sent,
                                   std::min(size - sent, kEchoChunkBytes));
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    status[i] = FromGrpc(writer->Finish(), "Upload");
    if (status[i].ok() && response.bytes() != size) {
      status[i] = absl::DataLossError("Upload: bytes lost");
    }
  });
  OnThreads(n, [&](int i) {
    if (!status[i].ok()) return;
    grpc::ClientContext context;
    SetDeadline(&context);
    Count request;
    request.set_bytes(static_cast<int64_t>(sources[i].size()));
    auto reader = stubs[i]->Download(&context, request);
    Blob chunk;
    int64_t got = 0;
    while (reader->Read(&chunk)) got += chunk.data().size();
    status[i] = FromGrpc(reader->Finish(), "Download");
    if (status[i].ok() && got != static_cast<int64_t>(sources[i].size())) {
      status[i] = absl::DataLossError("Download: bytes lost");
    }
  });
  for (const absl::Status& st : status) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// --- bnps

client::GrpcClientOptions ClientOptions(std::vector<std::string> servers,
                                      int worker, int workers) {
  client::GrpcClientOptions o;
  o.servers = std::move(servers);
  o.job = "bnps";
  o.worker = worker;
  o.num_workers = workers;
  o.rpc_timeout = absl::Seconds(30);
  return o;
}

// A worker of the bnps row: its own GrpcPsClient, calling BnForward back to
// back. A worker that stops leaves the others in a barrier; they fail at its
// (short) timeout, which is not their error.
absl::StatusOr<std::vector<double>> BnpsWorker(const Job& job,
                                               RowControl* control) {
  auto client = client::GrpcPsClient::Connect(ClientOptions(
      {absl::StrCat("127.0.0.1:", job.port)}, job.rank, job.workers));
  if (!client.ok()) {
    control->stop.store(true);
    return client.status();
  }
  bn::Moments local;
  local.count = 32;
  for (int c = 0; c < job.channels; ++c) {
    local.mean.push_back(0.01 * c + job.rank);
    local.m2.push_back(1.0 + c);
  }
  std::vector<double> us;
  CallPlan plan(job, control);
  for (int i = 0; plan.MayStart(i) && KeepGoing(job, control); ++i) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<client::BnForwardResult> result =
        (*client)->BnForward("bn/0", i, local);
    const double elapsed = MicrosSince(t0);
    if (!result.ok() || result->contributors != job.workers) {
      // Another worker stopped first: not this one's error.
      if (control->stop.exchange(true)) break;
      return result.ok() ? absl::InternalError("barrier skipped a worker")
                         : result.status();
    }
    if (i >= job.warmup) us.push_back(elapsed);
    plan.Finished(i);
  }
  return us;
}

// One sync shard server in this process; W workers of the pool.
absl::StatusOr<Latency> BnpsLatency(WorkerPool& pool, int channels, int workers,
                                    const Settings& s) {
  server::ShardOptions options;
  options.num_workers = workers;
  options.policy = policy::Policy::kSync;
  options.barrier_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<server::RunningServer>> server =
      server::RunningServer::Start(options, "127.0.0.1:0");
  if (!server.ok()) return server.status();
  Job job = RowJob(Peer::kBnps, channels, workers, s);
  job.port = (*server)->port();
  return pool.Run(job);
}

absl::StatusOr<std::vector<double>> RunJob(const Job& job,
                                           RowControl* control) {
  switch (job.peer) {
    case Peer::kBnps:
      return BnpsWorker(job, control);
    case Peer::kGloo:
      return GlooWorker(job, control);
    case Peer::kEcho:
    case Peer::kStar:
      return EchoWorker(job, control);
  }
  return absl::InvalidArgumentError("unknown peer");
}

// --- gradient push + pull: each system's reps in a fresh process

// bnps and echo push + pull throughput (MB/s) for one payload and S servers.
struct ThroughputRow {
  int mb = 0;
  int shards = 0;
  std::vector<int> keys_per_shard;
  absl::StatusOr<double> bnps = absl::UnknownError("not run");
  absl::StatusOr<double> echo = absl::UnknownError("not run");
};

// Untimed reps at the start of each grad child: the first connects and
// faults in the buffers.
constexpr int kGradWarmup = 2;
// How long one grad child may take, start to exit.
constexpr absl::Duration kGradChildBudget = absl::Seconds(90);

// The grad table's parameters for `mb` MB: (key, elements), at most
// kFloatsPerKey elements each.
std::vector<std::pair<std::string, int64_t>> GradKeys(int mb) {
  std::vector<std::pair<std::string, int64_t>> keys;
  for (int64_t left = mb * kMB / 4; left > 0; left -= kFloatsPerKey) {
    keys.emplace_back(absl::StrFormat("mb%d/w%02d", mb, keys.size()),
                      std::min(left, kFloatsPerKey));
  }
  return keys;
}

// One system's push + pull reps of `mb` MB over S servers, all in this
// process (a grad child: nothing of the other system is here). bnps: S shard
// servers (sync, one worker); a rep is PushGradients(step) of all keys
// (shared, as the trainer pushes) and PullParametersInto(step + 1) (applied
// at once; into the same buffers every rep, as the echo's reader reuses its
// message). echo: S echo servers, EchoPushPull. Returns the seconds of each
// timed rep.
absl::StatusOr<std::vector<double>> GradReps(bool bnps, int mb, int shards,
                                             int reps) {
  const Clock::time_point deadline =
      Clock::now() +
      absl::ToChronoNanoseconds(kGradChildBudget - absl::Seconds(10));
  std::vector<std::unique_ptr<server::RunningServer>> servers;
  std::vector<std::unique_ptr<EchoServer>> echo_servers;
  std::vector<std::unique_ptr<EchoService::Stub>> stubs;
  std::vector<std::string> addresses;
  for (int i = 0; i < shards; ++i) {
    if (bnps) {
      server::ShardOptions options;
      options.shard = i;
      options.num_shards = shards;
      options.policy = policy::Policy::kSync;
      auto server = server::RunningServer::Start(options, "127.0.0.1:0");
      if (!server.ok()) return server.status();
      addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
      servers.push_back(*std::move(server));
    } else {
      auto echo = EchoServer::Start();
      if (!echo.ok()) return echo.status();
      stubs.push_back((*echo)->NewStub());
      echo_servers.push_back(*std::move(echo));
    }
  }
  const int64_t bytes = mb * kMB;
  std::function<absl::Status(int)> rep;
  std::unique_ptr<client::GrpcPsClient> client;
  std::map<std::string, client::Param> pulled;
  std::shared_ptr<const std::map<std::string, client::Param>> shared;
  std::vector<std::string> sources;  // echo: each stub's share of the bytes
  if (bnps) {
    absl::StatusOr<std::unique_ptr<client::GrpcPsClient>> c =
        client::GrpcPsClient::Connect(ClientOptions(addresses, 0, 1));
    if (!c.ok()) return c.status();
    client = *std::move(c);
    std::map<std::string, client::Param> grads;
    for (const auto& [key, n] : GradKeys(mb)) {
      grads[key] = {{n}, std::vector<float>(n, 1e-4f)};
      pulled[key];
    }
    if (absl::Status s = client->InitParameters(grads); !s.ok()) return s;
    // Sent without a copy (the trainer's way); unchanged between reps.
    shared = std::make_shared<const std::map<std::string, client::Param>>(
        std::move(grads));
    rep = [&](int step) -> absl::Status {
      if (absl::Status s = client->PushGradients(step, 1, shared); !s.ok()) {
        return s;
      }
      return client->PullParametersInto(step + 1, &pulled);
    };
  } else {
    for (int i = 0; i < shards; ++i) {
      const int64_t share =
          bytes / shards + (i == shards - 1 ? bytes % shards : 0);
      sources.emplace_back(share, 'x');
    }
    rep = [&](int) { return EchoPushPull(stubs, sources); };
  }
  std::vector<double> seconds;
  for (int i = 0; i < kGradWarmup + reps && Clock::now() < deadline; ++i) {
    const Clock::time_point t0 = Clock::now();
    if (absl::Status s = rep(i); !s.ok()) return s;
    if (i >= kGradWarmup) seconds.push_back(MicrosSince(t0) * 1e-6);
  }
  if (seconds.empty()) return absl::DeadlineExceededError("no rep was timed");
  return seconds;
}

// Body of `--grad_child=SYSTEM,MB,S,REPS`: prints "reps" and the rep times in
// seconds, or "error", the status code and message, on one line.
int GradChildMain(const std::string& spec) {
  std::vector<std::string> f = absl::StrSplit(spec, ',');
  int mb = 0, shards = 0, reps = 0;
  if (f.size() != 4 || (f[0] != "bnps" && f[0] != "echo") ||
      !absl::SimpleAtoi(f[1], &mb) || !absl::SimpleAtoi(f[2], &shards) ||
      !absl::SimpleAtoi(f[3], &reps) || mb < 1 || shards < 1 || reps < 1) {
    absl::FPrintF(stderr,
                  "ps_benchmark: --grad_child=%s is not "
                  "bnps|echo,MB,S,REPS\n",
                  spec);
    return 2;
  }
  absl::StatusOr<std::vector<double>> got =
      GradReps(f[0] == "bnps", mb, shards, reps);
  if (got.ok()) {
    absl::PrintF("reps %s\n",
                 absl::StrJoin(*got, " ", [](std::string* out, double v) {
                   absl::StrAppend(out, absl::StrFormat("%.9g", v));
                 }));
  } else {
    absl::PrintF("error %d %s\n", static_cast<int>(got.status().code()),
                 absl::StrReplaceAll(got.status().message(), {{"\n", " "}}));
  }
  std::fflush(stdout);
  return 0;
}

// Runs this binary with --grad_child=spec and returns the rep times it
// printed. The child is killed (by its PID) if it outlives kGradChildBudget.
absl::StatusOr<std::vector<double>> RunGradChild(const std::string& spec) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  const std::string flag = absl::StrCat("--grad_child=", spec);
  char exe[] = "/proc/self/exe";
  char* argv[] = {exe, const_cast<char*>(flag.c_str()), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, exe, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (err != 0) {
    close(out[0]);
    return absl::InternalError(absl::StrCat("posix_spawn: ", strerror(err)));
  }
  const absl::Time deadline = absl::Now() + kGradChildBudget;
  std::string text;
  char buf[4096];
  ssize_t got;
  while ((got = ReadSome(out[0], buf, sizeof(buf), deadline)) > 0) {
    text.append(buf, got);
  }
  close(out[0]);
  const bool timed_out = got < 0 && absl::Now() >= deadline;
  if (got < 0) kill(pid, SIGKILL);  // past its budget, or its pipe failed
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat("grad child ", spec, " ran past ",
                     absl::FormatDuration(kGradChildBudget)));
  }
  std::vector<std::string> words =
      absl::StrSplit(absl::StripAsciiWhitespace(text), ' ', absl::SkipEmpty());
  if (!words.empty() && words[0] == "reps") {
    std::vector<double> seconds;
    for (size_t i = 1; i < words.size(); ++i) {
      double v;
      if (!absl::SimpleAtod(words[i], &v)) break;
      seconds.push_back(v);
    }
    if (seconds.size() + 1 == words.size() && !seconds.empty()) return seconds;
  }
  int code = 0;
  if (words.size() >= 2 && words[0] == "error" &&
      absl::SimpleAtoi(words[1], &code) && code > 0 && code <= 16) {
    std::vector<std::string> rest(words.begin() + 2, words.end());
    return absl::Status(static_cast<absl::StatusCode>(code),
                        absl::StrJoin(rest, " "));
  }
  return absl::InternalError(absl::StrCat("grad child ", spec,
                                          " ended (wait status ", wstatus,
                                          ") without a result"));
}

// Measures the grad table. Each system's reps of a row run in a fresh process
// (RunGradChild), so neither system runs in the heap the other left: in one
// process, reps alternating, the echo ran about 1.5x faster than it does alone
// (docs/server.md). To see the same machine, the rows are measured in
// --rounds rounds, the two systems one after the other in each, the first of
// them alternating; a cell is 2 * bytes over the median of all its reps.
std::vector<ThroughputRow> MeasureThroughput(const Settings& s) {
  std::vector<ThroughputRow> rows;
  for (int shards : s.shard_counts) {
    for (int mb : kPayloadMB) {
      ThroughputRow row;
      row.mb = mb;
      row.shards = shards;
      row.keys_per_shard.assign(shards, 0);
      for (const auto& [key, n] : GradKeys(mb)) {
        ++row.keys_per_shard[proto::ShardForKey(key, shards)];
      }
      // A value until a round fails (then its error) or the end (then MB/s).
      row.bnps = s.bnps ? absl::StatusOr<double>(0.0) : Skipped();
      row.echo = s.echo ? absl::StatusOr<double>(0.0) : Skipped();
      rows.push_back(std::move(row));
    }
  }
  std::vector<std::vector<double>> bnps_reps(rows.size()),
      echo_reps(rows.size());
  for (int round = 0; round < s.rounds; ++round) {
    for (size_t i = 0; i < rows.size(); ++i) {
      ThroughputRow& row = rows[i];
      const int reps =
          std::max(1, (s.push_pull_reps.at(row.mb) + s.rounds - 1) / s.rounds);
      for (const bool bnps : {round % 2 == 0, round % 2 != 0}) {
        absl::StatusOr<double>& cell = bnps ? row.bnps : row.echo;
        if (!cell.ok()) continue;  // skipped, or failed in an earlier round
        absl::StatusOr<std::vector<double>> got = RunGradChild(absl::StrCat(
            bnps ? "bnps" : "echo", ",", row.mb, ",", row.shards, ",", reps));
        if (!got.ok()) {
          cell = got.status();
          continue;
        }
        std::vector<double>& all = (bnps ? bnps_reps : echo_reps)[i];
        all.insert(all.end(), got->begin(), got->end());
      }
    }
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const double mb_moved = 2.0 * rows[i].mb;  // up and down
    if (rows[i].bnps.ok()) {
      rows[i].bnps = mb_moved / Percentile(bnps_reps[i], 0.5);
    }
    if (rows[i].echo.ok()) {
      rows[i].echo = mb_moved / Percentile(echo_reps[i], 0.5);
    }
  }
  return rows;
}

// --- output

std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

// Collects errors as numbered footnotes.
class Notes {
 public:
  std::string Cell(const absl::Status& status) {
    if (status == Skipped()) return "skipped";
    notes_.push_back(status.ToString());
    return absl::StrCat("fail[", notes_.size(), "]");
  }
  void Print() const {
    for (size_t i = 0; i < notes_.size(); ++i) {
      absl::PrintF("[%d] %s\n", i + 1, notes_[i]);
    }
  }

 private:
  std::vector<std::string> notes_;
};

std::string Micros(double us) {
  return absl::StrFormat(us < 10 ? "%.1f" : "%.0f", us);
}

std::string Ratio(double a, double b) { return absl::StrFormat("%.2f", a / b); }

void PrintLatencyTable(
    const std::map<std::pair<int, int>, absl::StatusOr<Latency>>& bnps,
    const std::map<std::pair<int, int>, absl::StatusOr<Latency>>& gloo,
    const std::map<std::pair<int, int>, absl::StatusOr<Latency>>& echo,
    const std::map<std::pair<int, int>, absl::StatusOr<Latency>>& star,
    const Settings& s) {
  Notes notes;
  absl::PrintF(
      "\n## BN-sync round trip, one layer (us; max over workers of each "
      "worker's p50 / p99; median of %d rounds)\n\n"
      "| C | W | bnps p50 | bnps p99 | gloo p50 | gloo p99 | echo p50 | "
      "echo p99 | star p50 | star p99 | bnps/gloo | bnps/echo | bnps/star | "
      "star/gloo |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      "\n",
      s.rounds);
  bool short_rows = false;
  // p50 ratio a/b, "-" where either failed or b is a local copy (gloo, W = 1).
  auto ratio = [](const absl::StatusOr<Latency>& a,
                  const absl::StatusOr<Latency>& b) -> std::string {
    if (!a.ok() || !b.ok() || b->p50_us < 1.0) return "-";
    return Ratio(a->p50_us, b->p50_us);
  };
  for (int c : s.channels) {
    for (int w : s.workers) {
      const std::pair<int, int> key(c, w);
      std::vector<std::string> cells = {absl::StrCat(c), absl::StrCat(w)};
      for (const auto* m : {&bnps, &gloo, &echo, &star}) {
        const absl::StatusOr<Latency>& l = m->at(key);
        if (!l.ok()) {
          cells.push_back(notes.Cell(l.status()));
          cells.push_back("");
          continue;
        }
        const std::string mark = l->samples < s.min_reps ? "*" : "";
        short_rows |= !mark.empty();
        cells.push_back(absl::StrCat(Micros(l->p50_us), mark));
        cells.push_back(absl::StrCat(Micros(l->p99_us), mark));
      }
      const auto& b = bnps.at(key);
      cells.push_back(ratio(b, gloo.at(key)));
      cells.push_back(ratio(b, echo.at(key)));
      cells.push_back(ratio(b, star.at(key)));
      cells.push_back(ratio(star.at(key), gloo.at(key)));
      absl::PrintF("| %s |\n", absl::StrJoin(cells, " | "));
    }
  }
  absl::PrintF(
      "\nRatios of p50s; < 1 means the first is faster. gloo with W = 1 is a "
      "local copy (no ratio). star: bare gRPC answering each round once all W "
      "are in, doing no work; bnps/star is the cost of bnps's work over that "
      "floor, star/gloo the floor against gloo.\n");
  if (short_rows)
    absl::PrintF("\n* fewer than %d calls: the row ran out of time\n",
                 s.min_reps);
  notes.Print();
}

void PrintThroughputTable(const std::vector<ThroughputRow>& rows) {
  Notes notes;
  absl::PrintF(
      "\n## Gradient push + pull, W = 1 (MB/s = 2 * payload / median rep)\n\n"
      "| MB | S | keys per shard | bnps MB/s | echo MB/s | bnps/echo |\n"
      "|---:|---:|---:|---:|---:|---:|\n");
  for (const ThroughputRow& r : rows) {
    auto cell = [&](const absl::StatusOr<double>& v) {
      return v.ok() ? absl::StrFormat("%.0f", *v) : notes.Cell(v.status());
    };
    absl::PrintF("| %d | %d | %s | %s | %s | %s |\n", r.mb, r.shards,
                 absl::StrJoin(r.keys_per_shard, "+"), cell(r.bnps),
                 cell(r.echo),
                 r.bnps.ok() && r.echo.ok() ? Ratio(*r.bnps, *r.echo) : "-");
  }
  notes.Print();
}

void MeasureLatency(WorkerPool& pool, const Settings& s);

// Parses a flag's list of positive integers into `out`.
bool PositiveInts(const std::vector<std::string>& in, absl::string_view flag,
                  int max, std::vector<int>* out) {
  for (const std::string& v : in) {
    int n;
    if (!absl::SimpleAtoi(v, &n) || n < 1 || n > max) {
      absl::FPrintF(stderr, "ps_benchmark: --%s: '%s' is not in [1, %d]\n",
                    flag, v, max);
      return false;
    }
    out->push_back(n);
  }
  if (out->empty()) {
    absl::FPrintF(stderr, "ps_benchmark: --%s is empty\n", flag);
    return false;
  }
  return true;
}

int Main() {
  if (const std::string spec = absl::GetFlag(FLAGS_grad_child); !spec.empty()) {
    return GradChildMain(spec);
  }
  Settings s;
  if (!PositiveInts(absl::GetFlag(FLAGS_workers), "workers", 64, &s.workers)) {
    return 2;
  }
  if (!PositiveInts(absl::GetFlag(FLAGS_channels), "channels", 1 << 16,
                    &s.channels)) {
    return 2;
  }
  s.bnps = s.gloo = s.echo = s.star = false;
  for (const std::string& name : absl::GetFlag(FLAGS_systems)) {
    bool* on = name == "bnps"   ? &s.bnps
               : name == "gloo" ? &s.gloo
               : name == "echo" ? &s.echo
               : name == "star" ? &s.star
                                : nullptr;
    if (on == nullptr) {
      absl::FPrintF(stderr,
                    "ps_benchmark: --systems: '%s' is not bnps, gloo, echo or "
                    "star\n",
                    name);
      return 2;
    }
    *on = true;
  }
  s.reps = std::max(1, absl::GetFlag(FLAGS_reps));
  s.min_reps = std::clamp(absl::GetFlag(FLAGS_min_reps), 1, s.reps);
  s.row_time = absl::Seconds(std::max(0.0, absl::GetFlag(FLAGS_row_seconds)));
  s.rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  if (absl::GetFlag(FLAGS_quick)) {
    s.warmup = 5;
    s.reps = std::min(s.reps, 50);
    s.min_reps = std::min(s.min_reps, s.reps);
    s.rounds = 1;
    s.row_budget = absl::Seconds(5);
    s.push_pull_reps = {{1, 3}, {16, 2}, {64, 1}};
  }
  absl::PrintF("# ps_benchmark\n\nmachine: %d cores, %s\n",
               std::thread::hardware_concurrency(), CpuModel());
  absl::PrintF(
      "settings: BN latency %d warm-up + %d to %d timed calls per worker and "
      "row (timing stops after %s once it has %d; at most %s a row), median "
      "of %d rounds; push+pull reps %s per system and row, split over the "
      "rounds, each system's share of a round in a fresh process after %d "
      "warm-up reps; S in {%s}; loopback "
      "127.0.0.1\n",
      s.warmup, s.min_reps, s.reps, absl::FormatDuration(s.row_time),
      s.min_reps, absl::FormatDuration(s.row_budget), s.rounds,
      absl::StrJoin(s.push_pull_reps, ", ",
                    [](std::string* out, const std::pair<const int, int>& p) {
                      absl::StrAppend(out, p.first, " MB: ", p.second);
                    }),
      kGradWarmup, absl::StrJoin(s.shard_counts, ", "));

  const std::string tables = absl::GetFlag(FLAGS_tables);
  const bool bn_table = absl::StrContains(tables, "bn");
  const bool grad_table = absl::StrContains(tables, "grad");
  if (!bn_table && !grad_table) {
    absl::FPrintF(stderr, "ps_benchmark: --tables=%s names no table\n", tables);
    return 2;
  }
  if (bn_table) {
    // First, while this process has no threads and no gRPC state.
    absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
        WorkerPool::Fork(*std::max_element(s.workers.begin(), s.workers.end()));
    if (!pool.ok()) {
      absl::FPrintF(stderr, "ps_benchmark: %s\n", pool.status().ToString());
      return 1;
    }
    MeasureLatency(**pool, s);
  }
  if (grad_table) {
    PrintThroughputTable(MeasureThroughput(s));
  }
  return 0;
}

// The median over rounds of a row's p50s and of its p99s (the first error,
// if a round failed).
absl::StatusOr<Latency> MedianOfRounds(
    const std::vector<absl::StatusOr<Latency>>& rounds) {
  std::vector<double> p50, p99;
  int samples = std::numeric_limits<int>::max();
  for (const absl::StatusOr<Latency>& r : rounds) {
    if (!r.ok()) return r.status();
    p50.push_back(r->p50_us);
    p99.push_back(r->p99_us);
    samples = std::min(samples, r->samples);
  }
  Latency l;
  l.p50_us = Percentile(p50, 0.5);
  l.p99_us = Percentile(p99, 0.5);
  l.samples = samples;
  return l;
}

// Measures and prints the BN-sync latency table. Each round measures every
// row, and in each row every system one after another, so that all see the
// same machine; a cell is the median over rounds.
void MeasureLatency(WorkerPool& pool, const Settings& s) {
  using Rounds =
      std::map<std::pair<int, int>, std::vector<absl::StatusOr<Latency>>>;
  Rounds gloo, bnps, echo, star;
  absl::StatusOr<std::unique_ptr<EchoServer>> echo_server =
      s.echo || s.star ? EchoServer::Start() : Skipped();
  for (int round = 0; round < s.rounds; ++round) {
    for (int c : s.channels) {
      for (int w : s.workers) {
        const std::pair<int, int> key(c, w);
        bnps[key].push_back(s.bnps ? BnpsLatency(pool, c, w, s) : Skipped());
        gloo[key].push_back(s.gloo ? GlooLatency(pool, c, w, s) : Skipped());
        for (const bool gather : {false, true}) {
          absl::StatusOr<Latency> l = Skipped();
          if ((gather ? s.star : s.echo) && echo_server.ok()) {
            l = EchoLatency(pool, **echo_server, c, w, gather, s);
          } else if (gather ? s.star : s.echo) {
            l = echo_server.status();
          }
          (gather ? star : echo)[key].push_back(std::move(l));
        }
      }
    }
  }
  echo_server = absl::CancelledError("done");
  auto medians = [](const Rounds& rounds) {
    std::map<std::pair<int, int>, absl::StatusOr<Latency>> out;
    for (const auto& [key, r] : rounds) out.emplace(key, MedianOfRounds(r));
    return out;
  };
  PrintLatencyTable(medians(bnps), medians(gloo), medians(echo), medians(star),
                    s);
}

}  // namespace
}  // namespace bnps::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Debian builds Abseil with Mutex deadlock detection on, which records a
  // lock graph at every acquisition; the tests keep it, the binaries do not.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return bnps::bench::Main();
}
