// The device side of the C ABI's device layer passes (bnps_device_pass_*,
// bnps_c_device_pass.cc): asynchronous copies between device memory and
// pinned host memory in a stream's order, and the pinned host buffers they
// use. Two implementations: CUDA's (the driver, libcuda.so.1, opened at run
// time as client/stream_exchanges.cc opens it for cuLaunchHostFunc: nothing
// links CUDA) and the host's (device memory is host memory: memcpy at once,
// no stream), which runs the same pass code on CPU tensors in the tests.
// Not part of the ABI.

#ifndef BNPS_PYTHON_NATIVE_BNPS_C_DEVICE_H_
#define BNPS_PYTHON_NATIVE_BNPS_C_DEVICE_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/stream_exchanges.h"

namespace bnps::c_abi {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  // Queues on `stream` a copy of `bytes` from device address `from` into
  // host buffer `to` (from HostBuffer), or from host `from` to device `to`;
  // never waits for the stream.
  virtual absl::Status ToHost(void* stream, void* to, const void* from,
                              size_t bytes) = 0;
  virtual absl::Status ToDevice(void* stream, void* to, const void* from,
                                size_t bytes) = 0;
  // Whether `stream` is capturing a CUDA graph now.
  virtual absl::StatusOr<bool> Capturing(void* stream) = 0;
  // `bytes` of zeroed host memory the copies can use asynchronously
  // (pinned, on CUDA), valid until this object goes. FAILED_PRECONDITION
  // while a stream of the process captures a graph (CUDA refuses then).
  virtual absl::StatusOr<void*> HostBuffer(size_t bytes) = 0;
};

// Device memory is host memory: copies are memcpy, made at once.
std::unique_ptr<DeviceOps> NewHostDeviceOps();

// The CUDA driver's asynchronous copies (cuMemcpyDtoHAsync,
// cuMemcpyHtoDAsync), cuStreamIsCapturing and pinned buffers
// (cuMemHostAlloc). UNAVAILABLE, saying why, where the driver is missing
// or lacks one of them. The calling thread must have the stream's context
// current.
absl::StatusOr<std::unique_ptr<DeviceOps>> NewCudaDeviceOps();

// The CPU tests' stand-in for a stream that captures a CUDA graph: a host
// DeviceOps and a HostFuncLauncher that run what they are given at once,
// except while recording (Capturing says so), when they record it; Replay
// then runs everything recorded again, in order, as a replay of the graph
// does (the device memory the copies name must stay valid meanwhile).
class Recorder {
 public:
  static std::shared_ptr<Recorder> New();
  virtual ~Recorder() = default;
  virtual void SetRecording(bool on) = 0;
  virtual void Replay() = 0;
  virtual std::unique_ptr<DeviceOps> NewDeviceOps() = 0;
  virtual std::unique_ptr<bnps::client::HostFuncLauncher> NewLauncher() = 0;
};

}  // namespace bnps::c_abi

#endif  // BNPS_PYTHON_NATIVE_BNPS_C_DEVICE_H_
