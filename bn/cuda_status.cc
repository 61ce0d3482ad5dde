#include "bn/cuda_status.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace bnps::bn {

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  std::string message = absl::StrCat(what, ": ", cudaGetErrorName(err), ": ",
                                     cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(std::move(message));
  }
  return absl::InternalError(std::move(message));
}

namespace {

absl::Status PinnedAllocate(size_t bytes, void** out) {
  return CudaStatus(cudaMallocHost(out, bytes),
                    absl::StrCat("cudaMallocHost of ", bytes, " bytes"));
}

void PinnedRelease(void* data) { cudaFreeHost(data); }

}  // namespace

StagingAllocator PinnedHostMemory() {
  return StagingAllocator{PinnedAllocate, PinnedRelease};
}

}  // namespace bnps::bn
