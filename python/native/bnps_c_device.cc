// bnps_c_device.h's two DeviceOps: the host's and the CUDA driver's.

#include "python/native/bnps_c_device.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace bnps::c_abi {
namespace {

class HostDeviceOps : public DeviceOps {
 public:
  absl::Status ToHost(void*, void* to, const void* from,
                      size_t bytes) override {
    std::memcpy(to, from, bytes);
    return absl::OkStatus();
  }
  absl::Status ToDevice(void*, void* to, const void* from,
                        size_t bytes) override {
    std::memcpy(to, from, bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Capturing(void*) override { return false; }
  absl::StatusOr<void*> HostBuffer(size_t bytes) override {
    absl::MutexLock lock(&mu_);
    buffers_.push_back(std::make_unique<char[]>(bytes));  // zeroed
    return buffers_.back().get();
  }

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<char[]>> buffers_ ABSL_GUARDED_BY(mu_);
};

// The driver's entry points used, as the driver declares them (CUresult is
// an int-sized enum, CUdeviceptr an unsigned 64-bit integer, CUstream an
// opaque pointer). The _v2 names are those cuda.h's macros select.
struct Driver {
  int (*dtoh)(void*, uint64_t, size_t, void*);
  int (*htod)(uint64_t, const void*, size_t, void*);
  int (*is_capturing)(void*, int*);
  int (*host_alloc)(void**, size_t, unsigned int);
  int (*free_host)(void*);
  int (*error_string)(int, const char**);
};

class CudaDeviceOps : public DeviceOps {
 public:
  explicit CudaDeviceOps(Driver d) : d_(d) {}
  ~CudaDeviceOps() override {
    absl::MutexLock lock(&mu_);
    for (void* p : buffers_) d_.free_host(p);  // (errors at exit: ignored)
  }

  absl::Status ToHost(void* stream, void* to, const void* from,
                      size_t bytes) override {
    return Check(d_.dtoh(to, reinterpret_cast<uint64_t>(from), bytes, stream),
                 "cuMemcpyDtoHAsync");
  }
  absl::Status ToDevice(void* stream, void* to, const void* from,
                        size_t bytes) override {
    return Check(d_.htod(reinterpret_cast<uint64_t>(to), from, bytes, stream),
                 "cuMemcpyHtoDAsync");
  }
  absl::StatusOr<bool> Capturing(void* stream) override {
    int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
    if (absl::Status s =
            Check(d_.is_capturing(stream, &status), "cuStreamIsCapturing");
        !s.ok()) {
      return s;
    }
    return status != 0;
  }
  absl::StatusOr<void*> HostBuffer(size_t bytes) override {
    void* p = nullptr;
    const int r = d_.host_alloc(&p, bytes, 0);
    if (r == 900) {  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
      return absl::FailedPreconditionError(
          "a bnps layer's first training pass cannot be captured in a CUDA "
          "graph (it allocates pinned host buffers, which CUDA refuses "
          "during a capture): run one eager step before capturing, as "
          "torch.cuda.graph's warm-up does");
    }
    if (absl::Status s = Check(r, "cuMemHostAlloc"); !s.ok()) return s;
    std::memset(p, 0, bytes);
    absl::MutexLock lock(&mu_);
    buffers_.push_back(p);
    return p;
  }

 private:
  absl::Status Check(int r, const char* call) const {
    if (r == 0) return absl::OkStatus();
    const char* what = nullptr;
    if (d_.error_string(r, &what) != 0 || what == nullptr) {
      what = "unknown error";
    }
    return absl::InternalError(absl::StrCat(
        call, " failed (CUDA error ", r, ": ", what,
        "); the calling thread needs the stream's CUDA context current"));
  }

  const Driver d_;
  absl::Mutex mu_;
  std::vector<void*> buffers_ ABSL_GUARDED_BY(mu_);
};

class RecorderImpl : public Recorder,
                     public std::enable_shared_from_this<RecorderImpl> {
 public:
  void SetRecording(bool on) override {
    absl::MutexLock lock(&mu_);
    recording_ = on;
  }
  bool recording() {
    absl::MutexLock lock(&mu_);
    return recording_;
  }
  void Replay() override {
    std::vector<std::function<void()>> ops;
    {
      absl::MutexLock lock(&mu_);
      ops = ops_;
    }
    for (auto& op : ops) op();
  }
  // Runs `op` now, or records it while recording.
  void Run(std::function<void()> op) {
    {
      absl::MutexLock lock(&mu_);
      if (recording_) {
        ops_.push_back(std::move(op));
        return;
      }
    }
    op();
  }
  std::unique_ptr<DeviceOps> NewDeviceOps() override;
  std::unique_ptr<bnps::client::HostFuncLauncher> NewLauncher() override;

 private:
  absl::Mutex mu_;
  bool recording_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::function<void()>> ops_ ABSL_GUARDED_BY(mu_);
};

class RecordingDeviceOps : public HostDeviceOps {
 public:
  explicit RecordingDeviceOps(std::shared_ptr<RecorderImpl> r)
      : r_(std::move(r)) {}
  absl::Status ToHost(void*, void* to, const void* from,
                      size_t bytes) override {
    r_->Run([=] { std::memcpy(to, from, bytes); });
    return absl::OkStatus();
  }
  absl::Status ToDevice(void*, void* to, const void* from,
                        size_t bytes) override {
    r_->Run([=] { std::memcpy(to, from, bytes); });
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Capturing(void*) override { return r_->recording(); }

 private:
  std::shared_ptr<RecorderImpl> r_;
};

class RecordingLauncher : public bnps::client::HostFuncLauncher {
 public:
  explicit RecordingLauncher(std::shared_ptr<RecorderImpl> r)
      : r_(std::move(r)) {}
  absl::Status Launch(void*, void (*fn)(void*), void* arg) override {
    r_->Run([fn, arg] { fn(arg); });
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<RecorderImpl> r_;
};

std::unique_ptr<DeviceOps> RecorderImpl::NewDeviceOps() {
  return std::make_unique<RecordingDeviceOps>(shared_from_this());
}

std::unique_ptr<bnps::client::HostFuncLauncher> RecorderImpl::NewLauncher() {
  return std::make_unique<RecordingLauncher>(shared_from_this());
}

template <typename Fn>
bool Find(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  return *fn != nullptr;
}

}  // namespace

std::shared_ptr<Recorder> Recorder::New() {
  return std::make_shared<RecorderImpl>();
}

std::unique_ptr<DeviceOps> NewHostDeviceOps() {
  return std::make_unique<HostDeviceOps>();
}

absl::StatusOr<std::unique_ptr<DeviceOps>> NewCudaDeviceOps() {
  // (Stays open: the buffers are freed through it.)
  absl::StatusOr<void*> opened = bnps::client::OpenCudaDriver(
      "a layer pass cannot copy to or from a CUDA device");
  if (!opened.ok()) return opened.status();
  void* lib = *opened;
  Driver d;
  if (!Find(lib, "cuMemcpyDtoHAsync_v2", &d.dtoh) ||
      !Find(lib, "cuMemcpyHtoDAsync_v2", &d.htod) ||
      !Find(lib, "cuStreamIsCapturing", &d.is_capturing) ||
      !Find(lib, "cuMemHostAlloc", &d.host_alloc) ||
      !Find(lib, "cuMemFreeHost", &d.free_host) ||
      !Find(lib, "cuGetErrorString", &d.error_string)) {
    return absl::UnavailableError(
        "the CUDA driver (libcuda.so.1) lacks cuMemcpyDtoHAsync_v2, "
        "cuMemcpyHtoDAsync_v2, cuStreamIsCapturing, cuMemHostAlloc, "
        "cuMemFreeHost or cuGetErrorString (CUDA >= 10 has them all)");
  }
  return std::make_unique<CudaDeviceOps>(d);
}

}  // namespace bnps::c_abi
