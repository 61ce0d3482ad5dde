#include "nn/cuda_common.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace bnps::nn::cuda_internal {

absl::Status CudnnStatus(cudnnStatus_t status, absl::string_view what) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  // cuDNN 9 keeps a more specific message per thread than the status string.
  char detail[512] = "";
  cudnnGetLastErrorString(detail, sizeof(detail));
  std::string message = absl::StrCat(what, ": ", cudnnGetErrorString(status));
  if (detail[0] != '\0') {
    absl::StrAppend(&message, " (last cuDNN message: ", detail, ")");
  }
  if (status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    return absl::ResourceExhaustedError(std::move(message));
  }
  return absl::InternalError(std::move(message));
}

absl::Status CublasStatus(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", cublasGetStatusName(status),
                                     ": ", cublasGetStatusString(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) {
    return absl::ResourceExhaustedError(std::move(message));
  }
  return absl::InternalError(std::move(message));
}

void DropCudnnMessage() {
  char sink[512];
  cudnnGetLastErrorString(sink, sizeof(sink));
}

void LogCudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  std::fprintf(stderr, "bnps cuda backend: %s: %s: %s\n", what,
               cudaGetErrorName(err), cudaGetErrorString(err));
}

}  // namespace bnps::nn::cuda_internal
