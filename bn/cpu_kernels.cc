#include "bn/cpu_kernels.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "util/cpu_clones.h"

namespace bnps::bn {
namespace {

// The mean as an unevaluated float sum hi + lo. (x - hi) is exact when x is
// within a factor of two of hi, so ((x - hi) - lo) keeps float32 arithmetic
// accurate when |mean| >> std.
struct SplitMean {
  float hi;
  float lo;
};

SplitMean Split(double mean) {
  const float hi = static_cast<float>(mean);
  return {hi, static_cast<float>(mean - static_cast<double>(hi))};
}

// Per-channel float coefficients of the elementwise kernels.
struct ChannelCoefficients {
  std::vector<float> hi, lo;  // the mean, split
  std::vector<double> inv_std;
};

ChannelCoefficients Coefficients(const Normalization& norm) {
  const size_t c = norm.mean.size();
  ChannelCoefficients k;
  k.hi.resize(c);
  k.lo.resize(c);
  k.inv_std.resize(c);
  for (size_t i = 0; i < c; ++i) {
    const SplitMean m = Split(norm.mean[i]);
    k.hi[i] = m.hi;
    k.lo[i] = m.lo;
    k.inv_std[i] = 1.0 / std::sqrt(norm.var[i] + norm.eps);
  }
  return k;
}

// Threads. The loops run on OpenMP threads (the process's count) once a tensor
// has more than kParallelThreshold elements: elementwise loops split over
// planes; reductions split over channels, and each channel is reduced by one
// thread over its planes in image order -- the order of the single-threaded
// loop -- so every result is bitwise the same for any number of threads.
constexpr int64_t kParallelThreshold = 1 << 15;

// The hot loops are compiled twice: for x86-64-v3 (AVX2, FMA) and for the
// baseline, picked at load time (BNPS_HOT_LOOP, util/cpu_clones.h), so the
// library runs on any x86-64.

// Moments of one contiguous plane of `len` >= 1 values. A float pass finds an
// approximate mean m; the double pass accumulates d = x - m and d^2, and
// mean = m + sum(d)/len, M2 = sum(d^2) - sum(d)^2/len are exact for any m, so the
// float pass only has to be close enough to avoid cancellation.
BNPS_HOT_LOOP
void PlaneMoments(const float* p, int64_t len, double* mean, double* m2) {
  float approx = 0;
#pragma omp simd reduction(+ : approx)
  for (int64_t i = 0; i < len; ++i) approx += p[i];
  const double m = static_cast<double>(approx) / static_cast<double>(len);
  double sq = 0, dev = 0;
#pragma omp simd reduction(+ : sq, dev)
  for (int64_t i = 0; i < len; ++i) {
    const double d = static_cast<double>(p[i]) - m;
    sq += d * d;
    dev += d;
  }
  *mean = m + dev / static_cast<double>(len);
  *m2 = sq - dev * dev / static_cast<double>(len);
  if (*m2 < 0) *m2 = 0;
}

// out = ((in - hi) - lo) * a + b.
BNPS_HOT_LOOP
void PlaneNormalize(const float* in, int64_t len, float hi, float lo, float a,
                    float b, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) out[i] = ((in[i] - hi) - lo) * a + b;
}

// sum(dy) and sum(dy * (x - mean)) in double.
BNPS_HOT_LOOP
void PlaneBackwardSums(const float* dy, const float* x, int64_t len, float hi,
                       float lo, double* sum_dy, double* sum_dy_d) {
  double a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
  for (int64_t j = 0; j < len; ++j) {
    const double g = dy[j];
    a += g;
    b += g * static_cast<double>((x[j] - hi) - lo);
  }
  *sum_dy += a;
  *sum_dy_d += b;
}

// dx = ka * dy + kb * (x - mean) + kc.
BNPS_HOT_LOOP
void PlaneBackwardInput(const float* dy, const float* x, int64_t len, float hi,
                        float lo, float ka, float kb, float kc, float* dx) {
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) {
    dx[j] = ka * dy[j] + kb * ((x[j] - hi) - lo) + kc;
  }
}

class CpuBnKernels final : public BnKernels {
 public:
  std::string name() const override { return "cpu"; }

  absl::StatusOr<Moments> ComputeMoments(const float* x,
                                         const Shape& shape) override {
    if (absl::Status s = ValidateMomentsArgs(x, shape); !s.ok()) return s;
    Moments out = Moments::Empty(shape.c);
    if (shape.PerChannel() == 0) return out;
    const int64_t n = shape.n, c = shape.c, len = shape.Spatial();
    if (len == 1) {
      RowMoments(x, n, c, &out);
      return out;
    }
    // Plane by plane, images in order: each plane's moments are merged into its
    // channel with Chan's formula (all planes have `len` samples). Channels
    // are independent, so threads split them.
    // The merge weights of image i depend on i alone: computed once, not per
    // plane.
    std::vector<double> wb(n), cross(n);
    for (int64_t i = 0; i < n; ++i) {
      const double na = static_cast<double>(i * len);
      const double n_total = na + static_cast<double>(len);
      wb[i] = static_cast<double>(len) / n_total;
      cross[i] = na * static_cast<double>(len) / n_total;
    }
    double* mean = out.mean.data();
    double* m2 = out.m2.data();
#pragma omp parallel for schedule(static) \
    if (shape.Elements() > kParallelThreshold)
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t i = 0; i < n; ++i) {
        double pm, pm2;
        PlaneMoments(x + (i * c + ch) * len, len, &pm, &pm2);
        const double delta = pm - mean[ch];
        mean[ch] += delta * wb[i];
        m2[ch] += pm2 + delta * delta * cross[i];
      }
    }
    out.count = shape.PerChannel();
    return out;
  }

  absl::Status Normalize(const float* x, const Shape& shape,
                         const Normalization& norm, float* y) override {
    if (absl::Status s = ValidateNormalizeArgs(x, shape, norm, y); !s.ok()) return s;
    const ChannelCoefficients k = Coefficients(norm);
    const int64_t c = shape.c;
    std::vector<float> scale(c), shift(c);
    for (int64_t ch = 0; ch < c; ++ch) {
      scale[ch] = static_cast<float>(norm.gamma[ch] * k.inv_std[ch]);
      shift[ch] = norm.beta[ch];
    }
    const int64_t len = shape.Spatial(), planes = shape.n * c;
#pragma omp parallel for schedule(static) \
    if (shape.Elements() > kParallelThreshold)
    for (int64_t p = 0; p < planes; ++p) {
      const int64_t ch = p % c, off = p * len;
      PlaneNormalize(x + off, len, k.hi[ch], k.lo[ch], scale[ch], shift[ch],
                     y + off);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<BackwardSums> BackwardReduce(
      const float* dy, const float* x, const Shape& shape,
      const Normalization& norm) override {
    if (absl::Status s = ValidateBackwardReduceArgs(dy, x, shape, norm); !s.ok()) return s;
    const ChannelCoefficients k = Coefficients(norm);
    BackwardSums sums = BackwardSums::Zero(shape.c);
    const int64_t n = shape.n, c = shape.c, len = shape.Spatial();
    double* sdy = sums.sum_dy.data();
    double* sdyd = sums.sum_dy_xhat.data();  // sum(dy * (x - mean)) first
    // Channels split over threads; each channel's planes in image order.
#pragma omp parallel for schedule(static) \
    if (shape.Elements() > kParallelThreshold)
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t off = (i * c + ch) * len;
        PlaneBackwardSums(dy + off, x + off, len, k.hi[ch], k.lo[ch], &sdy[ch],
                          &sdyd[ch]);
      }
    }
    for (int64_t ch = 0; ch < c; ++ch) sdyd[ch] *= k.inv_std[ch];
    return sums;
  }

  absl::Status BackwardInput(const float* dy, const float* x, const Shape& shape,
                             const Normalization& norm, const BackwardSums& sums,
                             int64_t count, float* dx) override {
    if (absl::Status s = ValidateBackwardInputArgs(dy, x, shape, norm, sums,
                                                   count, dx);
        !s.ok()) {
      return s;
    }
    if (shape.Elements() == 0) return absl::OkStatus();
    const ChannelCoefficients k = Coefficients(norm);
    const int64_t c = shape.c;
    // dx = gamma*inv * (dy - sum_dy/n - x_hat * sum_dy_xhat/n), x_hat = d*inv.
    std::vector<float> a(c), b(c), c0(c);
    const double inv_n = 1.0 / static_cast<double>(count);
    for (int64_t ch = 0; ch < c; ++ch) {
      const double gi = norm.gamma[ch] * k.inv_std[ch];
      a[ch] = static_cast<float>(gi);
      b[ch] = static_cast<float>(-gi * k.inv_std[ch] * sums.sum_dy_xhat[ch] * inv_n);
      c0[ch] = static_cast<float>(-gi * sums.sum_dy[ch] * inv_n);
    }
    const int64_t len = shape.Spatial(), planes = shape.n * c;
#pragma omp parallel for schedule(static) \
    if (shape.Elements() > kParallelThreshold)
    for (int64_t p = 0; p < planes; ++p) {
      const int64_t ch = p % c, off = p * len;
      PlaneBackwardInput(dy + off, x + off, len, k.hi[ch], k.lo[ch], a[ch],
                         b[ch], c0[ch], dx + off);
    }
    return absl::OkStatus();
  }

 private:
  // Moments of an N x C tensor (one sample per plane): per-channel sums across
  // rows, vectorized over channels, then the squared deviations.
  static void RowMoments(const float* x, int64_t n, int64_t c, Moments* out) {
    std::vector<double>& mean = out->mean;
    std::vector<double>& m2 = out->m2;
    std::vector<double> dev(c, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = x + i * c;
#pragma omp simd
      for (int64_t ch = 0; ch < c; ++ch) mean[ch] += row[ch];
    }
    for (int64_t ch = 0; ch < c; ++ch) mean[ch] /= static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = x + i * c;
#pragma omp simd
      for (int64_t ch = 0; ch < c; ++ch) {
        const double d = static_cast<double>(row[ch]) - mean[ch];
        m2[ch] += d * d;
        dev[ch] += d;
      }
    }
    for (int64_t ch = 0; ch < c; ++ch) {
      m2[ch] -= dev[ch] * dev[ch] / static_cast<double>(n);
      if (m2[ch] < 0) m2[ch] = 0;
      mean[ch] += dev[ch] / static_cast<double>(n);
    }
    out->count = n;
  }
};

}  // namespace

std::unique_ptr<BnKernels> NewCpuBnKernels() {
  return std::make_unique<CpuBnKernels>();
}

}  // namespace bnps::bn
