// The GPU implementation of nn/backend.h: convolutions with cuDNN,
// linear layers with cuBLAS, BN with the bn/ CUDA kernels, and the rest
// (ReLU, max pooling, global average pooling, Add, bias) with the backend's own
// kernels (nn/cuda_backend.cu).
//
// Numerics. Everything runs in float32 without tensor cores or TF32 (cuDNN
// FMA math, cuBLAS default math), so convolutions and matrix products differ
// from the CPU backend only by float summation order (the test allows 1e-4 of
// a tensor's largest value); ReLU, Add, max pooling and the average-pool
// gradient match it bitwise. Only deterministic algorithms are used: the same
// inputs and geometry give bitwise the same outputs on every call (cuDNN's
// heuristics, not timing, pick the algorithms; no floating-point atomics).
// Max pooling routes ties to the first maximum, as backend.h requires.
//
// Memory and streams. Buffers are device memory of the backend's device. The
// backend owns one blocking stream, with its cuDNN and cuBLAS handles bound to
// it, and synchronizes it before every call returns. bn() has a stream of its
// own and also synchronizes before returning, so calls of the two never
// overlap.
//
// Errors: as backend.h (INVALID_ARGUMENT from the Backend base class's checks;
// RESOURCE_EXHAUSTED when device memory runs out; INTERNAL with the CUDA, cuDNN
// or cuBLAS error text). Convolution sizes beyond cuDNN's int32 dimensions give
// INVALID_ARGUMENT (checked here, for a non-empty batch). NewCudaBackend
// returns FAILED_PRECONDITION with the CUDA error text when there is no such
// device.
//
// Ownership: the backend owns its stream, library handles, the BN kernels,
// per-geometry convolution descriptors and one scratch buffer; buffers from
// Allocate must be destroyed before the backend.
//
// Thread-safety: thread-compatible (one backend per worker thread); distinct
// backends may run concurrently, also on one device.
//
// Example:
//   std::string why;
//   if (bn::CudaDeviceCount(&why) == 0) ...  // take the CPU backend
//   absl::StatusOr<std::unique_ptr<Backend>> gpu = NewCudaBackend(0);
//   absl::StatusOr<Buffer> x = (*gpu)->Allocate(g.input_elements());

#ifndef BNPS_NN_CUDA_BACKEND_H_
#define BNPS_NN_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "nn/backend.h"

namespace bnps::nn {

// A backend on device `device_ordinal`; name() is "cuda:<ordinal>".
// FAILED_PRECONDITION if there is no such device; INTERNAL if the stream or a
// library handle cannot be created.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device_ordinal);

}  // namespace bnps::nn

#endif  // BNPS_NN_CUDA_BACKEND_H_
