// Plain C++ launchers of the CUDA batch-normalization kernels, the part of the
// CUDA backend that nvcc compiles. bn/cuda_kernels.cc wraps them into
// BnKernels; nothing else should call them (the benchmark does, to time the
// kernels alone). This header may include only CUDA and standard headers: nvcc
// never sees Abseil.
//
// Every launcher enqueues its kernels on `stream` and returns at once; results
// are ready when the stream is. Errors: the cudaError_t of the launch (checked
// with cudaGetLastError), or cudaErrorInvalidValue for dimensions or pointers
// that break a REQUIRES. All pointers, the per-channel parameter arrays
// included, are device memory owned by the caller. Reductions are
// deterministic: for a given shape the result is bitwise the same on every run
// and whatever the alignment of the pointers (the work split depends on the
// shape only, not on the GPU or the pointers, and every merge happens in a
// fixed order).
//
// Thread-safety: stateless functions.

#ifndef BNPS_BN_CUDA_KERNELS_INTERNAL_H_
#define BNPS_BN_CUDA_KERNELS_INTERNAL_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace bnps::bn::cuda_internal {

// An NCHW tensor as the kernels see it: S = h * w spatial positions.
struct Dims {
  int64_t n = 0;
  int64_t c = 1;
  int64_t s = 1;
};

// Moments of part of a channel: count, mean and M2 (count as a double, exact
// below 2^53).
struct MomentsPartial {
  double count;
  double mean;
  double m2;
};

// Backward sums of part of a channel: sum(dy) and sum(dy * d) with d the
// centred x below; the caller multiplies the second by invstd.
struct SumsPartial {
  double sum_dy;
  double sum_dy_d;
};

// A channel's mean as an unevaluated float sum hi + lo (hi = float(mean),
// lo = float(mean - hi)). The kernels centre x as d = (x - hi) - lo, in float:
// x - hi is exact when x is within a factor of two of hi, so d stays accurate
// when |mean| >> std.
struct SplitMean {
  float hi;
  float lo;
};

// Per-channel parameters of Normalize:
// y = ((x - mean_hi) - mean_lo) * scale + shift.
struct NormalizeParams {
  float mean_hi;
  float mean_lo;
  float scale;
  float shift;
};

// Per-channel parameters of BackwardInput: with d = (x - mean_hi) - mean_lo,
// dx = a * dy + b * d + c0.
struct BackwardInputParams {
  float mean_hi;
  float mean_lo;
  float a;
  float b;
  float c0;
};

// Partial results per channel the reductions use for `dims`: the `partials`
// buffers below hold dims.c * ReductionSplits(dims) entries.
int64_t ReductionSplits(const Dims& dims);

// out[c] = moments of channel c of x. REQUIRES: n * s > 0.
cudaError_t LaunchMoments(const float* x, const Dims& dims,
                          MomentsPartial* partials, MomentsPartial* out,
                          cudaStream_t stream);

// y = normalized x with params[c] (size dims.c). y may alias x.
cudaError_t LaunchNormalize(const float* x, const Dims& dims,
                            const NormalizeParams* params, float* y,
                            cudaStream_t stream);

// out[c] = {sum(dy), sum(dy * d)} over channel c, d = (x - hi) - lo in float
// with mean[c] (size dims.c), each product and the sums in double.
// REQUIRES: n * s > 0.
cudaError_t LaunchBackwardReduce(const float* dy, const float* x,
                                 const Dims& dims, const SplitMean* mean,
                                 SumsPartial* partials, SumsPartial* out,
                                 cudaStream_t stream);

// dx from dy, x and params[c] (size dims.c). dx may alias dy.
cudaError_t LaunchBackwardInput(const float* dy, const float* x,
                                const Dims& dims,
                                const BackwardInputParams* params, float* dx,
                                cudaStream_t stream);

}  // namespace bnps::bn::cuda_internal

#endif  // BNPS_BN_CUDA_KERNELS_INTERNAL_H_
