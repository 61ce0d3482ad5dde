// Plain C++ launchers of the CUDA backend's own kernels (the layers cuDNN and
// cuBLAS do not cover, or cover with different rules), the part of the backend
// that nvcc compiles. nn/cuda_backend.cc wraps them; nothing else should
// call them. This header may include only CUDA and standard headers: nvcc never
// sees Abseil.
//
// Every launcher enqueues its kernels on `stream` and returns at once; results
// are ready when the stream is. Sizes of 0 enqueue nothing. Errors: the
// cudaError_t of the launch, or cudaErrorInvalidValue for sizes or pointers
// that break a REQUIRES. All pointers are device memory owned by the caller.
// Every kernel is deterministic (no atomics, fixed-order sums), so the same
// inputs give bitwise the same outputs on every run.
//
// Thread-safety: stateless functions.

#ifndef BNPS_NN_CUDA_BACKEND_INTERNAL_H_
#define BNPS_NN_CUDA_BACKEND_INTERNAL_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace bnps::nn::cuda_internal {

// y[i, j] = b[j] for a row-major rows x cols matrix y.
cudaError_t LaunchBroadcastRows(const float* b, int64_t rows, int64_t cols,
                                float* y, cudaStream_t stream);

// out[j] = sum over i of m[i, j] for a row-major rows x cols matrix m, summed
// in double in a fixed order. REQUIRES: rows >= 1.
cudaError_t LaunchColumnSums(const float* m, int64_t rows, int64_t cols,
                             float* out, cudaStream_t stream);

// y = x > 0 ? x : 0 over n values. y may alias x.
cudaError_t LaunchReluForward(int64_t n, const float* x, float* y,
                              cudaStream_t stream);

// dx = y > 0 ? dy : 0 over n values. dx may alias dy.
cudaError_t LaunchReluBackward(int64_t n, const float* dy, const float* y,
                               float* dx, cudaStream_t stream);

// y = a + b over n values. y may alias a or b.
cudaError_t LaunchAdd(int64_t n, const float* a, const float* b, float* y,
                      cudaStream_t stream);

// Max pooling without padding over `planes` planes of height x width, windows
// kernel x kernel at `stride`, out_height x out_width outputs per plane.
// REQUIRES: the caller validated the geometry (nvcc cannot see
// nn::ValidatePoolGeometry); the launchers only check that sizes are positive.
struct PoolDims {
  int64_t planes = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t kernel = 0;
  int64_t stride = 0;
  int64_t out_height = 0;
  int64_t out_width = 0;
};

// y = the maximum of each window.
cudaError_t LaunchMaxPoolForward(const PoolDims& dims, const float* x, float* y,
                                 cudaStream_t stream);

// Bytes of scratch LaunchMaxPoolBackward needs: one index per output.
int64_t MaxPoolBackwardScratchBytes(const PoolDims& dims);

// dx = the sum of dy over the windows whose maximum (the first one in
// row-major window order) is that element, 0 elsewhere. Finds each window's
// maximum into `scratch` first, then gathers per input element, so
// overlapping windows need no atomics and the sum runs in output order.
cudaError_t LaunchMaxPoolBackward(const PoolDims& dims, const float* x,
                                  const float* dy, void* scratch, float* dx,
                                  cudaStream_t stream);

// y[p] = mean of the hw values of plane p (summed in double), p < planes.
// REQUIRES: hw >= 1.
cudaError_t LaunchGlobalAvgPoolForward(int64_t planes, int64_t hw,
                                       const float* x, float* y,
                                       cudaStream_t stream);

// dx[p, :] = dy[p] * (1 / hw), in float. REQUIRES: hw >= 1.
cudaError_t LaunchGlobalAvgPoolBackward(int64_t planes, int64_t hw,
                                        const float* dy, float* dx,
                                        cudaStream_t stream);

}  // namespace bnps::nn::cuda_internal

#endif  // BNPS_NN_CUDA_BACKEND_INTERNAL_H_
