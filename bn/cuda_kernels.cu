// CUDA kernels of batch normalization; see bn/cuda_kernels_internal.h.
//
// Layout. Element (n, c, s) of an NCHW tensor is at (n * C + c) * S + s. The
// kernels work on groups of kGroup consecutive elements of one (n, c) plane:
// kGroup = 4 when S % 4 == 0 (a group never straddles two planes), else 1. A
// group is loaded as one float4 when the pointers are 16-byte aligned, else as
// kGroup scalars; the grouping, and so every rounding, depends on the shape
// only. Grid-stride loops keep their (row, column, channel) position
// incrementally, so no loop iteration divides.
//
// Reductions (moments, backward sums) run in two kernels. The first has a grid
// of C x splits blocks of kThreads threads; block (c, j) owns the groups
// j * kThreads + t + i * splits * kThreads of channel c. Each thread accumulates
// its groups in double, in order: for the moments a group's own mean and M2
// (two-pass over the registers) merged into the thread's by Chan's formula, for
// the backward sums plain double sums. The block then merges its threads in a
// fixed tree (warp shuffles, then the warp results) and writes one partial. The
// second kernel (one warp per channel) merges the channel's partials in the
// same fixed way. No floating-point atomics anywhere, so every run gives the
// same bits. Moments never use sum / sum of squares: every merge is Chan's
// (n = na + nb, d = mb - ma, mean = ma + d * nb / n,
// M2 = M2a + M2b + d * d * na * nb / n), which stays accurate for
// |mean| >> std.

#include "bn/cuda_kernels_internal.h"

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace bnps::bn::cuda_internal {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kWarps = kThreads / kWarpSize;
constexpr unsigned kFullMask = 0xffffffffu;

// Reductions: a channel gets one more block per this many elements, up to
// kMaxSplits blocks.
constexpr int64_t kReduceElementsPerBlock = 4 * kThreads;
constexpr int64_t kMaxSplits = 1024;

// Elementwise kernels: one block per this many elements, up to kMaxBlocks (the
// grid-stride loop covers the rest).
constexpr int64_t kElementwiseElementsPerBlock = 4 * kThreads;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

// ---- Loading and storing groups --------------------------------------------

template <int kGroup>
struct Group {
  float v[kGroup];
};

template <int kGroup, bool kVector>
__device__ __forceinline__ Group<kGroup> LoadGroup(const float* p) {
  Group<kGroup> g;
  if constexpr (kVector) {
    static_assert(kGroup == 4, "vector access needs groups of 4");
    const float4 f = *reinterpret_cast<const float4*>(p);
    g.v[0] = f.x;
    g.v[1] = f.y;
    g.v[2] = f.z;
    g.v[3] = f.w;
  } else {
#pragma unroll
    for (int i = 0; i < kGroup; ++i) g.v[i] = p[i];
  }
  return g;
}

template <int kGroup, bool kVector>
__device__ __forceinline__ void StoreGroup(const Group<kGroup>& g, float* p) {
  if constexpr (kVector) {
    static_assert(kGroup == 4, "vector access needs groups of 4");
    *reinterpret_cast<float4*>(p) = make_float4(g.v[0], g.v[1], g.v[2], g.v[3]);
  } else {
#pragma unroll
    for (int i = 0; i < kGroup; ++i) p[i] = g.v[i];
  }
}

// Position of a grid-stride loop over rows of `cols` groups: row and column of
// the current group, and row % channels. Starting at `start` and advancing by
// `step` groups costs no division per step. REQUIRES: cols >= 1, channels >= 1.
struct Cursor {
  __device__ Cursor(int64_t start, int64_t step, int64_t cols, int64_t channels)
      : row(start / cols),
        col(start % cols),
        channel(row % channels),
        cols_(cols),
        channels_(channels),
        step_rows_(step / cols),
        step_cols_(step % cols),
        step_channels_(step_rows_ % channels) {}

  __device__ void Advance() {
    row += step_rows_;
    col += step_cols_;
    channel += step_channels_;
    if (col >= cols_) {
      col -= cols_;
      ++row;
      ++channel;
    }
    if (channel >= channels_) channel -= channels_;  // at most 2 * channels - 1
  }

  int64_t row;
  int64_t col;
  int64_t channel;

 private:
  int64_t cols_;
  int64_t channels_;
  int64_t step_rows_;
  int64_t step_cols_;
  int64_t step_channels_;
};

// ---- Merging partial results in a fixed order -----------------------------

// Chan's formula; zero counts contribute nothing. Not symmetric in rounding, so
// callers always pass the lower-indexed part first.
__device__ __forceinline__ MomentsPartial Combine(const MomentsPartial& a,
                                                  const MomentsPartial& b) {
  if (b.count == 0) return a;
  if (a.count == 0) return b;
  const double n = a.count + b.count;
  const double d = b.mean - a.mean;
  const double r = b.count / n;
  return {n, a.mean + d * r, a.m2 + b.m2 + d * d * a.count * r};
}

__device__ __forceinline__ SumsPartial Combine(const SumsPartial& a,
                                               const SumsPartial& b) {
  return {a.sum_dy + b.sum_dy, a.sum_dy_d + b.sum_dy_d};
}

__device__ __forceinline__ MomentsPartial ShuffleDown(const MomentsPartial& a,
                                                      int offset) {
  return {__shfl_down_sync(kFullMask, a.count, offset),
          __shfl_down_sync(kFullMask, a.mean, offset),
          __shfl_down_sync(kFullMask, a.m2, offset)};
}

__device__ __forceinline__ SumsPartial ShuffleDown(const SumsPartial& a,
                                                   int offset) {
  return {__shfl_down_sync(kFullMask, a.sum_dy, offset),
          __shfl_down_sync(kFullMask, a.sum_dy_d, offset)};
}

// Tree merge over a full warp; lane 0 gets the merge of lanes 0..31 in the
// order ((0,16),(8,24)),... which is the same on every run.
template <typename T>
__device__ __forceinline__ T WarpMerge(T a) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    a = Combine(a, ShuffleDown(a, offset));
  }
  return a;
}

// Merge over the block; thread 0 gets the result. T{} is the identity.
template <typename T>
__device__ __forceinline__ T BlockMerge(T a) {
  __shared__ T warp_results[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  a = WarpMerge(a);
  if (lane == 0) warp_results[warp] = a;
  __syncthreads();
  if (warp == 0) a = WarpMerge(lane < kWarps ? warp_results[lane] : T{});
  return a;
}

// ---- Kernels ----------------------------------------------------------------

// partials[c * splits + j] = moments of block (c, j)'s groups of channel c.
template <int kGroup, bool kVector>
__global__ void __launch_bounds__(kThreads)
    MomentsPartialKernel(const float* x, Dims dims, MomentsPartial* partials) {
  const int64_t c = blockIdx.x;
  const int64_t split = blockIdx.y;
  const int64_t splits = gridDim.y;
  const int64_t cols = dims.s / kGroup;
  const int64_t groups = dims.n * cols;
  const int64_t start = split * kThreads + threadIdx.x;
  const int64_t step = splits * kThreads;
  MomentsPartial acc{};
  if (start < groups) {
    Cursor cur(start, step, cols, 1);
    for (int64_t k = start; k < groups; k += step, cur.Advance()) {
      const Group<kGroup> g = LoadGroup<kGroup, kVector>(
          x + (cur.row * dims.c + c) * dims.s + cur.col * kGroup);
      double sum = 0;
#pragma unroll
      for (int i = 0; i < kGroup; ++i) sum += g.v[i];
      const double mean = sum * (1.0 / kGroup);  // exact: kGroup is 1 or 4
      double m2 = 0;
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        const double d = g.v[i] - mean;
        m2 += d * d;
      }
      acc = Combine(acc, MomentsPartial{static_cast<double>(kGroup), mean, m2});
    }
  }
  acc = BlockMerge(acc);
  if (threadIdx.x == 0) partials[c * splits + split] = acc;
}

// partials[c * splits + j] = backward sums of block (c, j)'s groups of
// channel c.
template <int kGroup, bool kVector>
__global__ void __launch_bounds__(kThreads)
    BackwardReducePartialKernel(const float* dy, const float* x, Dims dims,
                                const SplitMean* __restrict__ mean,
                                SumsPartial* partials) {
  const int64_t c = blockIdx.x;
  const int64_t split = blockIdx.y;
  const int64_t splits = gridDim.y;
  const int64_t cols = dims.s / kGroup;
  const int64_t groups = dims.n * cols;
  const int64_t start = split * kThreads + threadIdx.x;
  const int64_t step = splits * kThreads;
  const SplitMean mu = mean[c];
  SumsPartial acc{};
  if (start < groups) {
    Cursor cur(start, step, cols, 1);
    for (int64_t k = start; k < groups; k += step, cur.Advance()) {
      const int64_t offset = (cur.row * dims.c + c) * dims.s + cur.col * kGroup;
      const Group<kGroup> gdy = LoadGroup<kGroup, kVector>(dy + offset);
      const Group<kGroup> gx = LoadGroup<kGroup, kVector>(x + offset);
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        const double g = gdy.v[i];
        const float d = (gx.v[i] - mu.hi) - mu.lo;
        acc.sum_dy += g;
        acc.sum_dy_d += g * static_cast<double>(d);  // the product is exact
      }
    }
  }
  acc = BlockMerge(acc);
  if (threadIdx.x == 0) partials[c * splits + split] = acc;
}

// out[c] = merge of partials[c * splits + 0 .. splits - 1]; one warp per
// channel, lane l merging partials l, l + 32, ... in order, then the warp tree.
template <typename T>
__global__ void __launch_bounds__(kWarpSize)
    MergePartialsKernel(const T* partials, int64_t splits, T* out) {
  const int64_t c = blockIdx.x;
  T acc{};
  for (int64_t j = threadIdx.x; j < splits; j += kWarpSize) {
    acc = Combine(acc, partials[c * splits + j]);
  }
  acc = WarpMerge(acc);
  if (threadIdx.x == 0) out[c] = acc;
}

template <int kGroup, bool kVector>
__global__ void __launch_bounds__(kThreads)
    NormalizeKernel(const float* x, Dims dims,
                    const NormalizeParams* __restrict__ params, float* y) {
  const int64_t cols = dims.s / kGroup;
  const int64_t groups = dims.n * dims.c * cols;
  const int64_t start = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  const int64_t step = gridDim.x * int64_t{kThreads};
  if (start >= groups) return;
  Cursor cur(start, step, cols, dims.c);
  for (int64_t k = start; k < groups; k += step, cur.Advance()) {
    const NormalizeParams p = params[cur.channel];
    Group<kGroup> g = LoadGroup<kGroup, kVector>(x + k * kGroup);
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const float d = (g.v[i] - p.mean_hi) - p.mean_lo;
      g.v[i] = fmaf(d, p.scale, p.shift);
    }
    StoreGroup<kGroup, kVector>(g, y + k * kGroup);
  }
}

template <int kGroup, bool kVector>
__global__ void __launch_bounds__(kThreads)
    BackwardInputKernel(const float* dy, const float* x, Dims dims,
                        const BackwardInputParams* __restrict__ params,
                        float* dx) {
  const int64_t cols = dims.s / kGroup;
  const int64_t groups = dims.n * dims.c * cols;
  const int64_t start = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  const int64_t step = gridDim.x * int64_t{kThreads};
  if (start >= groups) return;
  Cursor cur(start, step, cols, dims.c);
  for (int64_t k = start; k < groups; k += step, cur.Advance()) {
    const BackwardInputParams p = params[cur.channel];
    Group<kGroup> gdy = LoadGroup<kGroup, kVector>(dy + k * kGroup);
    const Group<kGroup> gx = LoadGroup<kGroup, kVector>(x + k * kGroup);
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const float d = (gx.v[i] - p.mean_hi) - p.mean_lo;
      gdy.v[i] = fmaf(p.a, gdy.v[i], fmaf(p.b, d, p.c0));
    }
    StoreGroup<kGroup, kVector>(gdy, dx + k * kGroup);
  }
}

// ---- Launch helpers ---------------------------------------------------------

bool ValidDims(const Dims& dims) {
  return dims.n >= 0 && dims.c >= 1 && dims.s >= 0;
}

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Calls launch(group, vector) with the group size the shape allows and vector
// access when all `pointers` are 16-byte aligned; both as integral_constants.
template <typename Launch>
cudaError_t Dispatch(const Dims& dims,
                     std::initializer_list<const void*> pointers,
                     Launch launch) {
  if (dims.s % 4 != 0) {
    return launch(std::integral_constant<int, 1>{}, std::false_type{});
  }
  bool aligned = true;
  for (const void* p : pointers) aligned = aligned && Aligned16(p);
  if (aligned) {
    return launch(std::integral_constant<int, 4>{}, std::true_type{});
  }
  return launch(std::integral_constant<int, 4>{}, std::false_type{});
}

int64_t ElementwiseBlocks(const Dims& dims) {
  const int64_t elements = dims.n * dims.c * dims.s;
  const int64_t blocks = (elements + kElementwiseElementsPerBlock - 1) /
                         kElementwiseElementsPerBlock;
  return blocks < kMaxBlocks ? blocks : kMaxBlocks;
}

}  // namespace

// ---- Launchers --------------------------------------------------------------

int64_t ReductionSplits(const Dims& dims) {
  const int64_t per_channel = dims.n * dims.s;
  const int64_t splits =
      (per_channel + kReduceElementsPerBlock - 1) / kReduceElementsPerBlock;
  if (splits < 1) return 1;
  return splits < kMaxSplits ? splits : kMaxSplits;
}

cudaError_t LaunchMoments(const float* x, const Dims& dims,
                          MomentsPartial* partials, MomentsPartial* out,
                          cudaStream_t stream) {
  if (!ValidDims(dims) || dims.n * dims.s == 0 || x == nullptr ||
      partials == nullptr || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t splits = ReductionSplits(dims);
  const dim3 grid(static_cast<unsigned>(dims.c), static_cast<unsigned>(splits));
  const cudaError_t err = Dispatch(dims, {x}, [&](auto group, auto vector) {
    MomentsPartialKernel<decltype(group)::value, decltype(vector)::value>
        <<<grid, kThreads, 0, stream>>>(x, dims, partials);
    return cudaGetLastError();
  });
  if (err != cudaSuccess) return err;
  MergePartialsKernel<MomentsPartial>
      <<<static_cast<unsigned>(dims.c), kWarpSize, 0, stream>>>(partials,
                                                                splits, out);
  return cudaGetLastError();
}

cudaError_t LaunchNormalize(const float* x, const Dims& dims,
                            const NormalizeParams* params, float* y,
                            cudaStream_t stream) {
  if (!ValidDims(dims)) return cudaErrorInvalidValue;
  if (dims.n * dims.s == 0) return cudaSuccess;
  if (x == nullptr || params == nullptr || y == nullptr) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>(ElementwiseBlocks(dims));
  return Dispatch(dims, {x, y}, [&](auto group, auto vector) {
    NormalizeKernel<decltype(group)::value, decltype(vector)::value>
        <<<blocks, kThreads, 0, stream>>>(x, dims, params, y);
    return cudaGetLastError();
  });
}

cudaError_t LaunchBackwardReduce(const float* dy, const float* x,
                                 const Dims& dims, const SplitMean* mean,
                                 SumsPartial* partials, SumsPartial* out,
                                 cudaStream_t stream) {
  if (!ValidDims(dims) || dims.n * dims.s == 0 || dy == nullptr ||
      x == nullptr || mean == nullptr || partials == nullptr ||
      out == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t splits = ReductionSplits(dims);
  const dim3 grid(static_cast<unsigned>(dims.c), static_cast<unsigned>(splits));
  const cudaError_t err = Dispatch(dims, {dy, x}, [&](auto group, auto vector) {
    BackwardReducePartialKernel<decltype(group)::value, decltype(vector)::value>
        <<<grid, kThreads, 0, stream>>>(dy, x, dims, mean, partials);
    return cudaGetLastError();
  });
  if (err != cudaSuccess) return err;
  MergePartialsKernel<SumsPartial>
      <<<static_cast<unsigned>(dims.c), kWarpSize, 0, stream>>>(partials,
                                                                splits, out);
  return cudaGetLastError();
}

cudaError_t LaunchBackwardInput(const float* dy, const float* x,
                                const Dims& dims,
                                const BackwardInputParams* params, float* dx,
                                cudaStream_t stream) {
  if (!ValidDims(dims)) return cudaErrorInvalidValue;
  if (dims.n * dims.s == 0) return cudaSuccess;
  if (dy == nullptr || x == nullptr || params == nullptr || dx == nullptr) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>(ElementwiseBlocks(dims));
  return Dispatch(dims, {dy, x, dx}, [&](auto group, auto vector) {
    BackwardInputKernel<decltype(group)::value, decltype(vector)::value>
        <<<blocks, kThreads, 0, stream>>>(dy, x, dims, params, dx);
    return cudaGetLastError();
  });
}

}  // namespace bnps::bn::cuda_internal
