// What the parts of the CUDA backend (nn/cuda_backend.h) share: CUDA,
// cuDNN and cuBLAS errors turned into absl::Status, and owning wrappers of
// their handles. Private to the backend's target.
//
// Errors: RESOURCE_EXHAUSTED for an allocation failure, INTERNAL with the
// library's error text for anything else.
//
// Thread-safety: the functions are thread-safe; each reads or clears only the
// calling thread's last CUDA or cuDNN error.

#ifndef BNPS_NN_CUDA_COMMON_H_
#define BNPS_NN_CUDA_COMMON_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <memory>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "bn/cuda_status.h"

namespace bnps::nn::cuda_internal {

// bn/cuda_status.h: CUDA errors as Status, shared with the BN kernels.
using bn::CudaStatus;

// OK for CUDNN_STATUS_SUCCESS, else the error with cuDNN's last message.
absl::Status CudnnStatus(cudnnStatus_t status, absl::string_view what);

// OK for CUBLAS_STATUS_SUCCESS, else the error.
absl::Status CublasStatus(cublasStatus_t status, absl::string_view what);

// Reads away cuDNN's message of a failure that is not an error here (an
// algorithm the workspace query rules out), so a later error does not show it.
void DropCudnnMessage();

// For what must not fail (Backend::Free, destructors): errors only go to
// stderr.
void LogCudaError(cudaError_t err, const char* what);

template <typename Handle, auto kDestroy>
struct HandleDeleter {
  void operator()(Handle handle) const { (void)kDestroy(handle); }
};

// A CUDA or library handle (a pointer type) destroyed with kDestroy.
template <typename Handle, auto kDestroy>
using Owned = std::unique_ptr<std::remove_pointer_t<Handle>,
                              HandleDeleter<Handle, kDestroy>>;

using Stream = Owned<cudaStream_t, &cudaStreamDestroy>;
using CudnnHandle = Owned<cudnnHandle_t, &cudnnDestroy>;
using CublasHandle = Owned<cublasHandle_t, &cublasDestroy>;
using TensorDesc =
    Owned<cudnnTensorDescriptor_t, &cudnnDestroyTensorDescriptor>;
using FilterDesc =
    Owned<cudnnFilterDescriptor_t, &cudnnDestroyFilterDescriptor>;
using ConvDesc =
    Owned<cudnnConvolutionDescriptor_t, &cudnnDestroyConvolutionDescriptor>;

// Device memory from cudaMalloc of the current device.
struct DeviceFree {
  void operator()(void* p) const { LogCudaError(cudaFree(p), "cudaFree"); }
};
using DeviceMemory = std::unique_ptr<void, DeviceFree>;

}  // namespace bnps::nn::cuda_internal

#endif  // BNPS_NN_CUDA_COMMON_H_
