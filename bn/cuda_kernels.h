// BN kernels on an NVIDIA GPU (the BnKernels interface of bn/kernels.h), and a
// small owner of device memory for tests and benchmarks.
//
// Tensors passed to the kernels are device pointers; per-channel vectors and
// all results are host values. Each call validates its arguments as the CPU
// kernels do, enqueues its work on a stream the object owns and waits for that
// stream before returning, so results (Moments, BackwardSums) and outputs
// (y, dx) are complete when a method returns and the caller may reuse or free
// its buffers right away. The stream is a blocking one: work the caller queued
// on the legacy default stream is finished before the kernels read their
// inputs; work on other streams the caller must synchronize first. The
// waits are for that stream alone, never the whole device; the per-channel
// values cross through pinned host memory the object keeps (bn/
// staging_buffer.h) with asynchronous copies, so after the first call of a
// size nothing is allocated per call. Reductions
// accumulate in double and are deterministic: the same inputs and shape give
// bitwise the same results on every call (fixed-order merges, no
// floating-point atomics), whatever the alignment of the pointers.
//
// Errors: as bn/kernels.h (INVALID_ARGUMENT from the same validation as the CPU
// kernels); INTERNAL with the CUDA error text when a CUDA call fails;
// FAILED_PRECONDITION from NewCudaBnKernels when there is no such device.
//
// Ownership: the kernels object owns its stream, scratch and pinned memory; tensors
// stay the caller's. DeviceBuffer owns its allocation.
//
// Thread-safety: the kernels object is thread-compatible (one per thread, or
// external locking); distinct objects may run concurrently, also on one
// device. DeviceBuffer is thread-compatible. CudaDeviceCount is thread-safe.
//
// Example:
//   std::string why;
//   if (CudaDeviceCount(&why) == 0) return absl::UnavailableError(why);
//   absl::StatusOr<std::unique_ptr<BnKernels>> k = NewCudaBnKernels(0);
//   absl::StatusOr<DeviceBuffer> x = DeviceBuffer::Create(0, bytes);
//   ... x->CopyFromHost(host.data(), bytes);
//   absl::StatusOr<Moments> m = (*k)->ComputeMoments(x->floats(), shape);

#ifndef BNPS_BN_CUDA_KERNELS_H_
#define BNPS_BN_CUDA_KERNELS_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bn/kernels.h"

namespace bnps::bn {

// The number of usable CUDA devices; 0 when there are none or the runtime
// reports an error (no driver, driver too old, ...), with the error text in
// *why_none when given.
int CudaDeviceCount(std::string* why_none = nullptr);

// Makes `device_ordinal` the calling thread's current device.
// FAILED_PRECONDITION (with the reason) if there is no such device; INTERNAL
// if cudaSetDevice fails.
absl::Status SelectCudaDevice(int device_ordinal);

// Kernels on device `device_ordinal`, owning a stream and device scratch memory
// (grown as needed, freed with the object). name() is "cuda:<ordinal>".
// FAILED_PRECONDITION if there is no such device; INTERNAL if the stream cannot
// be created.
absl::StatusOr<std::unique_ptr<BnKernels>> NewCudaBnKernels(int device_ordinal);

// Owns `size()` bytes of device memory on one device (cudaMalloc / cudaFree).
// Move-only. Copies are synchronous (cudaMemcpy) and must not race with kernels
// still running on the buffer; the BnKernels above never leave any running.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;  // empty: data() is null, size() is 0
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // `bytes` bytes on `device_ordinal` (bytes may be 0: an empty buffer).
  // INTERNAL if cudaSetDevice or cudaMalloc fails.
  static absl::StatusOr<DeviceBuffer> Create(int device_ordinal, size_t bytes);

  void* data() const { return data_; }
  float* floats() const { return static_cast<float*>(data_); }
  size_t size() const { return size_; }

  // Copies `bytes` bytes between host memory and the start of the buffer.
  // INVALID_ARGUMENT if bytes > size() or a pointer is null for bytes > 0;
  // INTERNAL on a CUDA error.
  absl::Status CopyFromHost(const void* src, size_t bytes);
  absl::Status CopyToHost(void* dst, size_t bytes) const;

 private:
  DeviceBuffer(int device, void* data, size_t size)
      : device_(device), data_(data), size_(size) {}
  void Free();

  int device_ = 0;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace bnps::bn

#endif  // BNPS_BN_CUDA_KERNELS_H_
