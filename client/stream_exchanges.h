// StreamExchanges: BN exchanges run in the order of a device stream's work,
// so that a frontend whose kernels run on a GPU (bnps.torch) queues a whole
// training step without waiting for the device once per layer.
//
// A frontend queues, on its stream: the copy of a layer's local statistics
// into host memory, an exchange job (Enqueue), and the copy of the job's
// results back to the device. A HostFuncLauncher runs the job once the work
// queued before it on the stream is done and holds the stream's later work
// until the job returns (cuLaunchHostFunc: CudaHostFuncLauncher below), so
// the host never synchronizes with the device for an exchange, and the
// device waits only for the exchange itself.
//
// Failures. A job's exchange that fails records its error, and its fallback
// fills the job's outputs (with the local statistics, say) so that the
// stream's work goes on with finite numbers. Every later job skips its
// exchange and runs its fallback at once (nobody waits out a barrier
// timeout per layer), and every later Enqueue and Drain returns the first
// error: it is sticky, since the job's step counts no longer match the
// servers'. The frontend raises it, one or more layers after the layer
// that failed.
//
// CUDA graphs. A job queued while its stream captures a graph
// (EnqueueReplayable) becomes a host node of the graph: it runs at every
// replay, so it is kept (with what it captures) until this object's state
// goes, is not counted as pending (how often it runs is the replays'), and
// must read what changes per step when it RUNS, not when it was queued. A
// failure in a replay is sticky as any other and surfaces at the next
// Enqueue or Drain. Replays must end before this object is destroyed.
//
// Lifetime. Queued jobs own what they capture; they also run after this
// object is gone (a job holds its shared state). Host memory the caller's
// jobs read or write must outlive them: until Drain returns OK, or the
// stream was synchronized.
//
// Thread-safety: every method may be called from any thread; jobs run on
// the launcher's thread (the CUDA driver's), one at a time per stream.
#ifndef BNPS_CLIENT_STREAM_EXCHANGES_H_
#define BNPS_CLIENT_STREAM_EXCHANGES_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace bnps::client {

// Runs host functions in a stream's order.
class HostFuncLauncher {
 public:
  virtual ~HostFuncLauncher() = default;
  // Runs fn(arg) after the work queued on `stream` so far, holding the
  // stream's later work until it returns; fn runs exactly once when this
  // returns OK, never otherwise. Must not block for the stream.
  virtual absl::Status Launch(void* stream, void (*fn)(void*), void* arg) = 0;
};

// Runs each function inside Launch (host memory, no stream: the CPU path
// and tests).
std::unique_ptr<HostFuncLauncher> NewInlineLauncher();

// cuLaunchHostFunc of the CUDA driver (libcuda.so.1, opened at run time:
// nothing links CUDA). `stream` is a CUstream / cudaStream_t (null: the
// legacy default stream); the calling thread must have the stream's
// context current (as after any CUDA runtime call on its device).
// UNAVAILABLE, saying why, where there is no CUDA driver.
absl::StatusOr<std::unique_ptr<HostFuncLauncher>> NewCudaHostFuncLauncher();

// The CUDA driver, libcuda.so.1, opened (and left open: what it hands out
// may outlive its users) for dlsym; UNAVAILABLE, saying why, where there is
// none. `what` ends the message: what cannot be done without it.
absl::StatusOr<void*> OpenCudaDriver(const char* what);

class StreamExchanges {
 public:
  // One exchange: `exchange` talks to the servers and writes the job's
  // outputs; `fallback` writes them without the servers, after a failure
  // (of this job or an earlier one). Neither may call CUDA.
  struct Job {
    std::function<absl::Status()> exchange;
    std::function<void()> fallback;
  };

  explicit StreamExchanges(std::unique_ptr<HostFuncLauncher> launcher);
  ~StreamExchanges();
  StreamExchanges(const StreamExchanges&) = delete;
  StreamExchanges& operator=(const StreamExchanges&) = delete;

  // Queues `job` on `stream`. The first error of an earlier job (nothing
  // is queued then), or the launcher's.
  absl::Status Enqueue(void* stream, Job job);

  // Enqueue for a job that may run many times: one captured into a CUDA
  // graph, which runs at each replay (see CUDA graphs above).
  absl::Status EnqueueReplayable(void* stream, Job job);

  // Waits until every queued job has run, at most `timeout`; then the
  // first error of a job (sticky), DEADLINE_EXCEEDED naming how many are
  // still queued, or OK.
  absl::Status Drain(absl::Duration timeout);

  // Jobs queued that have not finished running.
  int64_t pending() const;
  // Jobs run so far, and how many of them ran their fallback.
  int64_t completed() const;
  int64_t fell_back() const;
  // Drain calls that found jobs still queued and waited for them (the
  // host waiting for the device).
  int64_t drain_waits() const;
  // Time the jobs' exchanges took so far (their calls to the servers and
  // what follows on the host), summed.
  absl::Duration exchange_time() const;

  struct State;  // shared with queued jobs

 private:
  absl::Status Launch(void* stream, Job job, bool replayable);

  std::unique_ptr<HostFuncLauncher> launcher_;
  std::shared_ptr<State> state_;
};

}  // namespace bnps::client

#endif  // BNPS_CLIENT_STREAM_EXCHANGES_H_
