// nn/cuda_backend.h in a build without CUDA (--config=cpu, e.g. the
// CPU container image): no device, so the worker takes the CPU backend.

#include "absl/status/status.h"
#include "nn/cuda_backend.h"

namespace bnps::nn {

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int) {
  return absl::FailedPreconditionError(
      "this build has no CUDA (built with --config=cpu)");
}

}  // namespace bnps::nn
