#include "client/stream_exchanges.h"

#include <dlfcn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace bnps::client {

struct Launched;  // below

struct StreamExchanges::State {
  mutable absl::Mutex mu;
  int64_t pending ABSL_GUARDED_BY(mu) = 0;
  int64_t completed ABSL_GUARDED_BY(mu) = 0;
  int64_t fell_back ABSL_GUARDED_BY(mu) = 0;
  int64_t drain_waits ABSL_GUARDED_BY(mu) = 0;
  absl::Duration exchange_time ABSL_GUARDED_BY(mu);
  absl::Status first_error ABSL_GUARDED_BY(mu);
  // The replayable jobs' launches (RunJob leaves them alone).
  std::vector<std::unique_ptr<Launched>> kept ABSL_GUARDED_BY(mu);
};

// What a launched host function gets: the job and the state it reports to
// (a replayable one, kept by that state, points to it without owning it).
struct Launched {
  StreamExchanges::Job job;
  std::shared_ptr<StreamExchanges::State> state;
  StreamExchanges::State* kept_by = nullptr;
};

namespace {

void RunJob(void* arg) {
  Launched* launched = static_cast<Launched*>(arg);
  const bool replayable = launched->kept_by != nullptr;
  std::unique_ptr<Launched> owned(replayable ? nullptr : launched);
  const Launched* l = launched;
  StreamExchanges::State& s =
      replayable ? *launched->kept_by : *launched->state;
  bool failed_before;
  {
    absl::MutexLock lock(&s.mu);
    failed_before = !s.first_error.ok();
  }
  const absl::Time start = absl::Now();
  absl::Status status = failed_before ? absl::OkStatus() : l->job.exchange();
  const absl::Duration took = absl::Now() - start;
  const bool fall_back = failed_before || !status.ok();
  if (fall_back && l->job.fallback) l->job.fallback();
  absl::MutexLock lock(&s.mu);
  if (!status.ok() && s.first_error.ok()) s.first_error = std::move(status);
  if (!replayable) --s.pending;
  ++s.completed;
  s.exchange_time += took;
  if (fall_back) ++s.fell_back;
}

bool NoneLeft(int64_t* pending) { return *pending == 0; }

class InlineLauncher : public HostFuncLauncher {
 public:
  absl::Status Launch(void* /*stream*/, void (*fn)(void*), void* arg) override {
    fn(arg);
    return absl::OkStatus();
  }
};

// The few driver entry points used, as the driver declares them (CUresult
// is an int-sized enum; CUstream an opaque pointer).
using CuInitFn = int (*)(unsigned int);
using CuLaunchHostFuncFn = int (*)(void*, void (*)(void*), void*);
using CuGetErrorStringFn = int (*)(int, const char**);

class CudaHostFuncLauncher : public HostFuncLauncher {
 public:
  // The driver library stays open (queued host functions may outlive this
  // object).
  CudaHostFuncLauncher(CuLaunchHostFuncFn launch,
                       CuGetErrorStringFn error_string)
      : launch_(launch), error_string_(error_string) {}

  absl::Status Launch(void* stream, void (*fn)(void*), void* arg) override {
    const int r = launch_(stream, fn, arg);
    if (r == 0) return absl::OkStatus();
    const char* what = nullptr;
    if (error_string_ == nullptr || error_string_(r, &what) != 0 ||
        what == nullptr) {
      what = "unknown error";
    }
    return absl::InternalError(absl::StrCat(
        "cuLaunchHostFunc failed (CUDA error ", r, ": ", what,
        "); the calling thread needs the stream's CUDA context current"));
  }

 private:
  CuLaunchHostFuncFn launch_;
  CuGetErrorStringFn error_string_;
};

}  // namespace

std::unique_ptr<HostFuncLauncher> NewInlineLauncher() {
  return std::make_unique<InlineLauncher>();
}

absl::StatusOr<void*> OpenCudaDriver(const char* what) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrCat(
        "no CUDA driver here (libcuda.so.1: ", why ? why : "not found",
        "): ", what));
  }
  return lib;
}

absl::StatusOr<std::unique_ptr<HostFuncLauncher>> NewCudaHostFuncLauncher() {
  absl::StatusOr<void*> opened =
      OpenCudaDriver("exchanges cannot be queued on a CUDA stream");
  if (!opened.ok()) return opened.status();
  void* lib = *opened;
  auto init = reinterpret_cast<CuInitFn>(dlsym(lib, "cuInit"));
  auto launch =
      reinterpret_cast<CuLaunchHostFuncFn>(dlsym(lib, "cuLaunchHostFunc"));
  auto error_string =
      reinterpret_cast<CuGetErrorStringFn>(dlsym(lib, "cuGetErrorString"));
  if (init == nullptr || launch == nullptr) {
    return absl::UnavailableError(
        "the CUDA driver (libcuda.so.1) has no cuLaunchHostFunc (CUDA >= 10 "
        "has it): exchanges cannot be queued on a CUDA stream");
  }
  if (const int r = init(0); r != 0) {
    return absl::UnavailableError(absl::StrCat(
        "the CUDA driver did not start (cuInit: CUDA error ", r, ")"));
  }
  return std::make_unique<CudaHostFuncLauncher>(launch, error_string);
}

StreamExchanges::StreamExchanges(std::unique_ptr<HostFuncLauncher> launcher)
    : launcher_(std::move(launcher)), state_(std::make_shared<State>()) {}

StreamExchanges::~StreamExchanges() = default;

absl::Status StreamExchanges::Enqueue(void* stream, Job job) {
  return Launch(stream, std::move(job), /*replayable=*/false);
}

absl::Status StreamExchanges::EnqueueReplayable(void* stream, Job job) {
  return Launch(stream, std::move(job), /*replayable=*/true);
}

absl::Status StreamExchanges::Launch(void* stream, Job job, bool replayable) {
  Launched* arg;
  std::unique_ptr<Launched> launched;
  {
    absl::MutexLock lock(&state_->mu);
    if (!state_->first_error.ok()) return state_->first_error;
    if (replayable) {
      state_->kept.push_back(std::make_unique<Launched>(
          Launched{std::move(job), nullptr, state_.get()}));
      arg = state_->kept.back().get();
    } else {
      ++state_->pending;
      launched =
          std::make_unique<Launched>(Launched{std::move(job), state_});
      arg = launched.get();
    }
  }
  absl::Status s = launcher_->Launch(stream, &RunJob, arg);
  if (s.ok()) {
    launched.release();  // RunJob owns it now (it may have run already)
    return s;
  }
  absl::MutexLock lock(&state_->mu);
  if (!replayable) --state_->pending;  // (a kept one stays kept: harmless)
  return s;
}

absl::Status StreamExchanges::Drain(absl::Duration timeout) {
  absl::MutexLock lock(&state_->mu);
  if (state_->pending > 0) ++state_->drain_waits;
  state_->mu.AwaitWithTimeout(absl::Condition(&NoneLeft, &state_->pending),
                              timeout);
  if (!state_->first_error.ok()) return state_->first_error;
  if (state_->pending > 0) {
    return absl::DeadlineExceededError(absl::StrCat(
        state_->pending, " queued BN exchange(s) had not run after ",
        absl::FormatDuration(timeout),
        ": the device stream they wait behind has not reached them"));
  }
  return absl::OkStatus();
}

int64_t StreamExchanges::pending() const {
  absl::MutexLock lock(&state_->mu);
  return state_->pending;
}

int64_t StreamExchanges::completed() const {
  absl::MutexLock lock(&state_->mu);
  return state_->completed;
}

int64_t StreamExchanges::drain_waits() const {
  absl::MutexLock lock(&state_->mu);
  return state_->drain_waits;
}

absl::Duration StreamExchanges::exchange_time() const {
  absl::MutexLock lock(&state_->mu);
  return state_->exchange_time;
}

int64_t StreamExchanges::fell_back() const {
  absl::MutexLock lock(&state_->mu);
  return state_->fell_back;
}

}  // namespace bnps::client
