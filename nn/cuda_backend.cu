// The CUDA backend's own kernels; see nn/cuda_backend_internal.h.
//
// Elementwise kernels are grid-stride loops over int64 indices. Reductions
// (column sums, plane means) accumulate in double and merge in a fixed order,
// and max-pool backward gathers per input element instead of scattering with
// atomics, so every kernel gives the same bits on every run.

#include "nn/cuda_backend_internal.h"

#include <cstdint>

namespace bnps::nn::cuda_internal {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// One block per kThreads work items up to this many; grid-stride loops cover
// the rest.
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

// Column sums: a block covers kTileColumns columns with kRowStreams threads
// per column, each summing every kRowStreams-th row.
constexpr int kTileColumns = 32;
constexpr int kRowStreams = 8;

unsigned Blocks(int64_t items, int64_t per_block) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// The runtime reports launch errors through cudaGetLastError, which also holds
// any earlier, non-sticky error of this thread (a failed cudaMalloc, say) that
// its own call already reported. Dropping that first keeps it from being
// blamed on the launch; a sticky error survives and fails the launch anyway.
void DropStaleError() { (void)cudaGetLastError(); }

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// ---- Elementwise ------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    BroadcastRowsKernel(const float* __restrict__ b, int64_t rows, int64_t cols,
                        float* __restrict__ y) {
  const int64_t total = rows * cols;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    y[i] = b[i % cols];
  }
}

__global__ void __launch_bounds__(kThreads)
    ReluForwardKernel(int64_t n, const float* x, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads)
    ReluBackwardKernel(int64_t n, const float* dy, const float* y, float* dx) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads)
    AddKernel(int64_t n, const float* a, const float* b, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    y[i] = a[i] + b[i];
  }
}

__global__ void __launch_bounds__(kThreads)
    GlobalAvgPoolBackwardKernel(int64_t planes, int64_t hw,
                                const float* __restrict__ dy,
                                float* __restrict__ dx) {
  const int64_t total = planes * hw;
  // dy * (1 / hw) rather than dy / hw: the CPU backend's rounding.
  const float scale = 1.0f / static_cast<float>(hw);
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    dx[i] = dy[i / hw] * scale;
  }
}

// ---- Reductions -------------------------------------------------------------

// Block (kTileColumns, kRowStreams): thread (c, r) sums rows r,
// r + kRowStreams, ... of its column; row stream 0 then adds the streams in
// order.
__global__ void __launch_bounds__(kTileColumns * kRowStreams)
    ColumnSumsKernel(const float* __restrict__ m, int64_t rows, int64_t cols,
                     float* __restrict__ out) {
  __shared__ double partial[kRowStreams][kTileColumns];
  const int64_t tiles = (cols + kTileColumns - 1) / kTileColumns;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t j = tile * kTileColumns + threadIdx.x;
    double acc = 0;
    if (j < cols) {
      for (int64_t i = threadIdx.y; i < rows; i += kRowStreams) {
        acc += m[i * cols + j];
      }
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
      double sum = 0;
      for (int r = 0; r < kRowStreams; ++r) sum += partial[r][threadIdx.x];
      out[j] = static_cast<float>(sum);
    }
    __syncthreads();  // before the next tile overwrites `partial`
  }
}

// One warp per plane; the lanes' double sums merge in a fixed shuffle tree.
__global__ void __launch_bounds__(kThreads)
    GlobalAvgPoolForwardKernel(int64_t planes, int64_t hw,
                               const float* __restrict__ x,
                               float* __restrict__ y) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = GridThreads() / kWarpSize;
  // p is the same in all lanes of a warp, so the shuffles see full warps.
  for (int64_t p = GlobalThread() / kWarpSize; p < planes; p += warps) {
    const float* plane = x + p * hw;
    double acc = 0;
    for (int64_t i = lane; i < hw; i += kWarpSize) acc += plane[i];
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      acc += __shfl_down_sync(kFullMask, acc, offset);
    }
    if (lane == 0) y[p] = static_cast<float>(acc / static_cast<double>(hw));
  }
}

// ---- Max pooling ------------------------------------------------------------

// The maximum of the window at (h0, w0) of `plane` and its plane-local index:
// the first maximum in row-major window order (later values must be strictly
// greater to win), the tie rule of nn/backend.h.
__device__ __forceinline__ void WindowMax(const float* __restrict__ plane,
                                          const PoolDims& d, int64_t h0,
                                          int64_t w0, float* best,
                                          int64_t* at) {
  int64_t best_at = h0 * d.width + w0;
  float best_v = plane[best_at];
  for (int64_t kh = 0; kh < d.kernel; ++kh) {
    const int64_t row = (h0 + kh) * d.width + w0;
    for (int64_t kw = 0; kw < d.kernel; ++kw) {
      const float v = plane[row + kw];
      if (v > best_v) {
        best_v = v;
        best_at = row + kw;
      }
    }
  }
  *best = best_v;
  *at = best_at;
}

// Calls f(plane, oh, ow, o) for each output o this thread owns.
template <typename F>
__device__ __forceinline__ void ForEachOutput(const PoolDims& d, F f) {
  const int64_t total = d.planes * d.out_height * d.out_width;
  for (int64_t o = GlobalThread(); o < total; o += GridThreads()) {
    const int64_t ow = o % d.out_width;
    const int64_t rest = o / d.out_width;
    f(rest / d.out_height, rest % d.out_height, ow, o);
  }
}

__global__ void __launch_bounds__(kThreads)
    MaxPoolForwardKernel(PoolDims d, const float* __restrict__ x,
                         float* __restrict__ y) {
  ForEachOutput(d, [&](int64_t p, int64_t oh, int64_t ow, int64_t o) {
    float best;
    int64_t at;
    WindowMax(x + p * d.height * d.width, d, oh * d.stride, ow * d.stride,
              &best, &at);
    y[o] = best;
  });
}

__global__ void __launch_bounds__(kThreads)
    MaxPoolArgmaxKernel(PoolDims d, const float* __restrict__ x,
                        int64_t* __restrict__ argmax) {
  ForEachOutput(d, [&](int64_t p, int64_t oh, int64_t ow, int64_t o) {
    float best;
    int64_t at;
    WindowMax(x + p * d.height * d.width, d, oh * d.stride, ow * d.stride,
              &best, &at);
    argmax[o] = at;
  });
}

// dx at (h, w) = sum of dy over the windows containing (h, w) whose maximum it
// is, in row-major output order (the order a sequential scatter adds them).
__global__ void __launch_bounds__(kThreads)
    MaxPoolGatherKernel(PoolDims d, const int64_t* __restrict__ argmax,
                        const float* __restrict__ dy, float* __restrict__ dx) {
  const int64_t total = d.planes * d.height * d.width;
  const int64_t outputs = d.out_height * d.out_width;
  for (int64_t e = GlobalThread(); e < total; e += GridThreads()) {
    const int64_t w = e % d.width;
    const int64_t rest = e / d.width;
    const int64_t h = rest % d.height;
    const int64_t p = rest / d.height;
    const int64_t at = h * d.width + w;
    // Windows o with o * stride <= h <= o * stride + kernel - 1.
    const int64_t oh_lo =
        h < d.kernel ? 0 : (h - d.kernel + d.stride) / d.stride;
    const int64_t ow_lo =
        w < d.kernel ? 0 : (w - d.kernel + d.stride) / d.stride;
    const int64_t oh_hi = min(h / d.stride, d.out_height - 1);
    const int64_t ow_hi = min(w / d.stride, d.out_width - 1);
    const int64_t* plane_argmax = argmax + p * outputs;
    const float* plane_dy = dy + p * outputs;
    float sum = 0.0f;
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh) {
      for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const int64_t o = oh * d.out_width + ow;
        if (plane_argmax[o] == at) sum += plane_dy[o];
      }
    }
    dx[e] = sum;
  }
}

bool ValidPool(const PoolDims& d) {
  return d.planes >= 0 && d.height >= 1 && d.width >= 1 && d.kernel >= 1 &&
         d.stride >= 1 && d.out_height >= 1 && d.out_width >= 1;
}

}  // namespace

// ---- Launchers --------------------------------------------------------------

cudaError_t LaunchBroadcastRows(const float* b, int64_t rows, int64_t cols,
                                float* y, cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (b == nullptr || y == nullptr) return cudaErrorInvalidValue;
  DropStaleError();
  BroadcastRowsKernel<<<Blocks(rows * cols, kThreads), kThreads, 0, stream>>>(
      b, rows, cols, y);
  return cudaGetLastError();
}

cudaError_t LaunchColumnSums(const float* m, int64_t rows, int64_t cols,
                             float* out, cudaStream_t stream) {
  if (rows < 1 || cols < 0) return cudaErrorInvalidValue;
  if (cols == 0) return cudaSuccess;
  if (m == nullptr || out == nullptr) return cudaErrorInvalidValue;
  DropStaleError();
  const dim3 block(kTileColumns, kRowStreams);
  ColumnSumsKernel<<<Blocks(cols, kTileColumns), block, 0, stream>>>(m, rows,
                                                                     cols, out);
  return cudaGetLastError();
}

cudaError_t LaunchReluForward(int64_t n, const float* x, float* y,
                              cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  DropStaleError();
  ReluForwardKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t LaunchReluBackward(int64_t n, const float* dy, const float* y,
                               float* dx, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dy == nullptr || y == nullptr || dx == nullptr) {
    return cudaErrorInvalidValue;
  }
  DropStaleError();
  ReluBackwardKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(n, dy, y,
                                                                   dx);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(int64_t n, const float* a, const float* b, float* y,
                      cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (a == nullptr || b == nullptr || y == nullptr) {
    return cudaErrorInvalidValue;
  }
  DropStaleError();
  AddKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(n, a, b, y);
  return cudaGetLastError();
}

cudaError_t LaunchMaxPoolForward(const PoolDims& dims, const float* x, float* y,
                                 cudaStream_t stream) {
  if (!ValidPool(dims)) return cudaErrorInvalidValue;
  if (dims.planes == 0) return cudaSuccess;
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  const int64_t outputs = dims.planes * dims.out_height * dims.out_width;
  DropStaleError();
  MaxPoolForwardKernel<<<Blocks(outputs, kThreads), kThreads, 0, stream>>>(
      dims, x, y);
  return cudaGetLastError();
}

int64_t MaxPoolBackwardScratchBytes(const PoolDims& dims) {
  return dims.planes * dims.out_height * dims.out_width *
         static_cast<int64_t>(sizeof(int64_t));
}

cudaError_t LaunchMaxPoolBackward(const PoolDims& dims, const float* x,
                                  const float* dy, void* scratch, float* dx,
                                  cudaStream_t stream) {
  if (!ValidPool(dims)) return cudaErrorInvalidValue;
  if (dims.planes == 0) return cudaSuccess;
  if (x == nullptr || dy == nullptr || scratch == nullptr || dx == nullptr) {
    return cudaErrorInvalidValue;
  }
  auto* argmax = static_cast<int64_t*>(scratch);
  const int64_t outputs = dims.planes * dims.out_height * dims.out_width;
  const int64_t inputs = dims.planes * dims.height * dims.width;
  DropStaleError();
  MaxPoolArgmaxKernel<<<Blocks(outputs, kThreads), kThreads, 0, stream>>>(
      dims, x, argmax);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return err;
  }
  MaxPoolGatherKernel<<<Blocks(inputs, kThreads), kThreads, 0, stream>>>(
      dims, argmax, dy, dx);
  return cudaGetLastError();
}

cudaError_t LaunchGlobalAvgPoolForward(int64_t planes, int64_t hw,
                                       const float* x, float* y,
                                       cudaStream_t stream) {
  if (planes < 0 || hw < 1) return cudaErrorInvalidValue;
  if (planes == 0) return cudaSuccess;
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  DropStaleError();
  GlobalAvgPoolForwardKernel<<<Blocks(planes * kWarpSize, kThreads), kThreads,
                               0, stream>>>(planes, hw, x, y);
  return cudaGetLastError();
}

cudaError_t LaunchGlobalAvgPoolBackward(int64_t planes, int64_t hw,
                                        const float* dy, float* dx,
                                        cudaStream_t stream) {
  if (planes < 0 || hw < 1) return cudaErrorInvalidValue;
  if (planes == 0) return cudaSuccess;
  if (dy == nullptr || dx == nullptr) return cudaErrorInvalidValue;
  DropStaleError();
  GlobalAvgPoolBackwardKernel<<<Blocks(planes * hw, kThreads), kThreads, 0,
                                stream>>>(planes, hw, dy, dx);
  return cudaGetLastError();
}

}  // namespace bnps::nn::cuda_internal
