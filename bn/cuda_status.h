// What the BN kernels (bn/cuda_kernels) and the worker's CUDA backend
// (nn/) share of the CUDA runtime: its errors as absl::Status, and
// page-locked host memory for their StagingBuffers. Only in builds with the
// CUDA toolkit (not under --config=cpu).

#ifndef BNPS_BN_CUDA_STATUS_H_
#define BNPS_BN_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "bn/staging_buffer.h"

namespace bnps::bn {

// OK for cudaSuccess, else "<what>: <name>: <text>": RESOURCE_EXHAUSTED for
// an allocation that failed, INTERNAL otherwise. Clears the thread's last
// CUDA error so a later launch check does not report it again (sticky
// errors stay, and fail every later call anyway). Thread-safe.
absl::Status CudaStatus(cudaError_t err, absl::string_view what);

// cudaMallocHost / cudaFreeHost: host memory the device copies into and out
// of asynchronously. A failed allocation is RESOURCE_EXHAUSTED.
StagingAllocator PinnedHostMemory();

}  // namespace bnps::bn

#endif  // BNPS_BN_CUDA_STATUS_H_
