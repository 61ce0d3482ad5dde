// The batch-normalization kernels, split the way synchronized BN needs them.
//
// Training-mode BN over a set of samples S (one worker's batch, or the global
// batch of all workers) is built from four steps, each a kernel here:
//
//   forward   ComputeMoments(x)         local (count, mean, M2)  -> merged by caller
//             Normalize(x, stats)       y = gamma * (x - mean) / sqrt(var + eps) + beta
//   backward  BackwardReduce(dy, x)     local sum(dy), sum(dy * x_hat) -> reduced by caller
//             BackwardInput(dy, x, sums, count)  dx
//
// Between the steps the caller merges: moments with bn/moments.h, backward sums
// with AddSums. Which sums and which count go into BackwardInput decides the
// variant (n_own = this worker's samples per channel):
//
//   local BN   sums over the own batch,     count = n_own
//   sync BN    sums over all workers,       count = global count
//   async BN   sums over the own batch,     count = n_own + n_others
//
// The async case normalizes with merge(own fresh moments, others' moments) and
// treats the others' moments as constants. Then d mean / d x_i = 1/n and
// d var / d x_i = 2 (x_i - mean) / n with n the merged count, while the loss only
// sees the own outputs, so
//   dx_i = gamma / sqrt(var + eps) * (dy_i - sum_own(dy) / n - x_hat_i * sum_own(dy * x_hat) / n).
// That is BackwardInput with local sums and the merged count (checked by finite
// differences in gradient_check_test.cc).
//
// dgamma and dbeta of a worker are its local sum(dy * x_hat) and sum(dy); the
// optimizer sums them across workers like any other gradient.
//
// Pointers to tensors point into the memory of the backend (host memory for the
// CPU kernels, device memory for the CUDA kernels) and hold shape.Elements()
// floats in NCHW layout. Per-channel vectors are always in host memory. Every
// reduction accumulates in double.
//
// Errors: INVALID_ARGUMENT for a bad shape, per-channel vectors of the wrong
// size, null pointers for a non-empty tensor, eps <= 0, a negative or non-finite
// variance, or a count smaller than the local one; INTERNAL (with the CUDA error
// text) when a CUDA call fails.
//
// Thread-safety: implementations are thread-compatible; use one per thread (the
// CUDA kernels own a stream).

#ifndef BNPS_BN_KERNELS_H_
#define BNPS_BN_KERNELS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bn/moments.h"
#include "bn/shape.h"

namespace bnps::bn {

// The statistics and affine parameters a forward pass normalized with; the
// backward pass takes the same. Host memory, each of size C; not owned.
struct Normalization {
  absl::Span<const double> mean;
  absl::Span<const double> var;  // biased variance (M2 / count)
  absl::Span<const float> gamma;
  absl::Span<const float> beta;  // unused by the backward kernels
  double eps = 1e-5;
};

// Per-channel sums of the backward pass. Unlike moments, they may be
// infinite or NaN: a mixed-precision step whose scaled loss overflowed
// (torch's GradScaler) gives such sums, and then every worker of the round
// must get a non-finite gradient, as with torch's SyncBatchNorm, so that
// every GradScaler skips the step. They propagate as IEEE arithmetic does;
// nothing keeps them beyond the step.
struct BackwardSums {
  std::vector<double> sum_dy;       // = dbeta of these samples
  std::vector<double> sum_dy_xhat;  // = dgamma of these samples

  static BackwardSums Zero(int64_t channels);
};

// acc += part, channel by channel (non-finite values propagate).
// INVALID_ARGUMENT if the sizes differ.
absl::Status AddSums(const BackwardSums& part, BackwardSums* acc);
// AddSums for a part already known good: sums decoded by proto::DecodeSums
// or computed by a kernel. It checks nothing. REQUIRES: `part` has acc's
// channel count in both arrays.
void AccumulateSums(const BackwardSums& part, BackwardSums* acc);

// The backward pass of BN over `count` samples per channel as an affine map
// of dy and x, per channel in double: dx = k1 * dy + k2 * x + k3, from the
// statistics normalized with (mean, biased var, eps > 0), gamma (empty for
// ones) and the sums over those samples. For kernels that apply it as fused
// multiply-adds (torch's, on python/bnps/torch's generic path).
// INVALID_ARGUMENT for sizes that differ, count < 1 or eps <= 0.
struct InputGradientMap {
  std::vector<double> k1, k2, k3;
};
absl::StatusOr<InputGradientMap> InputGradient(absl::Span<const double> mean,
                                               absl::Span<const double> var,
                                               absl::Span<const double> gamma,
                                               double eps,
                                               const BackwardSums& sums,
                                               int64_t count);

// The pieces of those checks.
// OK if `norm` fits a tensor of `shape` (sizes, eps > 0, finite var >= 0);
// `need_beta` says whether beta must be present.
absl::Status ValidateNormalization(const Shape& shape, const Normalization& norm,
                                   bool need_beta);

// INVALID_ARGUMENT if `p` is null for a non-empty tensor of `shape`; `what`
// names it in the message.
absl::Status ValidateTensor(const float* p, const Shape& shape, const char* what);

// OK if `sums` fit a tensor of `shape` (C channels; any values, see
// BackwardSums) and `count` is at least the tensor's samples per channel.
absl::Status ValidateBackwardSums(const Shape& shape, const BackwardSums& sums,
                                  int64_t count);

// The argument checks of each kernel below, the same for every
// implementation (each kernel calls its own first): INVALID_ARGUMENT as the
// header comment lists.
absl::Status ValidateMomentsArgs(const float* x, const Shape& shape);
absl::Status ValidateNormalizeArgs(const float* x, const Shape& shape,
                                   const Normalization& norm, const float* y);
absl::Status ValidateBackwardReduceArgs(const float* dy, const float* x,
                                        const Shape& shape,
                                        const Normalization& norm);
absl::Status ValidateBackwardInputArgs(const float* dy, const float* x,
                                       const Shape& shape,
                                       const Normalization& norm,
                                       const BackwardSums& sums, int64_t count,
                                       const float* dx);

class BnKernels {
 public:
  virtual ~BnKernels() = default;

  // "cpu" or "cuda:<ordinal>".
  virtual std::string name() const = 0;

  // Moments of x per channel. count = shape.PerChannel() (0 gives Empty).
  virtual absl::StatusOr<Moments> ComputeMoments(const float* x,
                                                 const Shape& shape) = 0;

  // y = gamma * (x - mean) / sqrt(var + eps) + beta. y may alias x.
  virtual absl::Status Normalize(const float* x, const Shape& shape,
                                 const Normalization& norm, float* y) = 0;

  // Local backward sums: sum(dy) and sum(dy * x_hat) per channel, where
  // x_hat = (x - mean) / sqrt(var + eps).
  virtual absl::StatusOr<BackwardSums> BackwardReduce(
      const float* dy, const float* x, const Shape& shape,
      const Normalization& norm) = 0;

  // dx from dy, x and sums reduced over the samples that share the statistics,
  // `count` of them per channel (see the table above). REQUIRES (checked):
  // count >= shape.PerChannel(). dx may alias dy.
  virtual absl::Status BackwardInput(const float* dy, const float* x,
                                     const Shape& shape,
                                     const Normalization& norm,
                                     const BackwardSums& sums, int64_t count,
                                     float* dx) = 0;
};

}  // namespace bnps::bn

#endif  // BNPS_BN_KERNELS_H_
