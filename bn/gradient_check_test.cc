// Finite-difference checks of the backward pass of synchronized and asynchronous
// BN. The loss is L = sum_k w_k * y_k over the outputs a worker owns; its
// gradient with respect to the outputs is w, which is fed to the kernels as dy.
// Central differences are taken in double on a double-precision forward pass.

#include <cmath>
#include <vector>

#include "bn/cpu_kernels.h"
#include "bn/reference.h"
#include "gtest/gtest.h"

namespace bnps::bn {
namespace {

using reference::MaxRelativeError;

constexpr double kEps = 1e-5;
constexpr double kStep = 1e-4;

// Moments of channel c of a double tensor, as (count, mean, m2).
void ChannelMoments(const std::vector<double>& x, const Shape& shape, int64_t c,
                    double* count, double* mean, double* m2) {
  const int64_t len = shape.Spatial();
  double sum = 0;
  *count = static_cast<double>(shape.PerChannel());
  for (int64_t i = 0; i < shape.n; ++i)
    for (int64_t s = 0; s < len; ++s) sum += x[(i * shape.c + c) * len + s];
  *mean = sum / *count;
  *m2 = 0;
  for (int64_t i = 0; i < shape.n; ++i)
    for (int64_t s = 0; s < len; ++s) {
      const double d = x[(i * shape.c + c) * len + s] - *mean;
      *m2 += d * d;
    }
}

// sum_k w_k * y_k where y normalizes x with merge(moments of x, others), others
// held constant (others.count == 0 gives plain training-mode BN).
double Loss(const std::vector<double>& x, const Shape& shape,
            const std::vector<float>& w, const std::vector<float>& gamma,
            const std::vector<float>& beta, const Moments& others) {
  double loss = 0;
  const int64_t len = shape.Spatial();
  for (int64_t c = 0; c < shape.c; ++c) {
    double na, ma, m2a;
    ChannelMoments(x, shape, c, &na, &ma, &m2a);
    const double nb = static_cast<double>(others.count);
    const double mb = others.count ? others.mean[c] : 0.0;
    const double m2b = others.count ? others.m2[c] : 0.0;
    const double n = na + nb;
    const double mean = (na * ma + nb * mb) / n;
    const double var = (m2a + m2b + (mb - ma) * (mb - ma) * na * nb / n) / n;
    const double inv = 1.0 / std::sqrt(var + kEps);
    for (int64_t i = 0; i < shape.n; ++i)
      for (int64_t s = 0; s < len; ++s) {
        const int64_t k = (i * shape.c + c) * len + s;
        loss += w[k] * (gamma[c] * (x[k] - mean) * inv + beta[c]);
      }
  }
  return loss;
}

std::vector<double> NumericGradient(const std::vector<float>& x32,
                                    const Shape& shape,
                                    const std::vector<float>& w,
                                    const std::vector<float>& gamma,
                                    const std::vector<float>& beta,
                                    const Moments& others) {
  std::vector<double> x(x32.begin(), x32.end());
  std::vector<double> grad(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    const double keep = x[k];
    x[k] = keep + kStep;
    const double up = Loss(x, shape, w, gamma, beta, others);
    x[k] = keep - kStep;
    const double down = Loss(x, shape, w, gamma, beta, others);
    x[k] = keep;
    grad[k] = (up - down) / (2 * kStep);
  }
  return grad;
}

struct Inputs {
  Shape shape;
  std::vector<float> x, w, gamma, beta;
};

Inputs MakeInputs(const Shape& shape, uint64_t seed) {
  return {shape, reference::RandomTensor(shape, 0.7, 1.3, seed, 0.4),
          reference::RandomTensor(shape, 0.0, 1.0, seed + 1),
          reference::RandomVector(shape.c, 0.5, 1.5, seed + 2),
          reference::RandomVector(shape.c, -0.5, 0.5, seed + 3)};
}

// dx from the kernels given the moments to merge with and the count to use.
std::vector<float> KernelGradient(const Inputs& in, const Moments& others,
                                  bool use_merged_count) {
  auto kernels = NewCpuBnKernels();
  Moments own = *kernels->ComputeMoments(in.x.data(), in.shape);
  const int64_t own_count = own.count;
  const Moments merged = *MergeMoments({own, others});
  const std::vector<double> var = BiasedVariance(merged);
  const Normalization norm{merged.mean, var, in.gamma, in.beta, kEps};
  const BackwardSums sums =
      *kernels->BackwardReduce(in.w.data(), in.x.data(), in.shape, norm);
  std::vector<float> dx(in.x.size());
  EXPECT_TRUE(kernels
                  ->BackwardInput(in.w.data(), in.x.data(), in.shape, norm, sums,
                                  use_merged_count ? merged.count : own_count,
                                  dx.data())
                  .ok());
  return dx;
}

TEST(GradientCheckTest, LocalBatchNorm) {
  const Inputs in = MakeInputs({5, 3, 2, 3}, 1);
  const Moments none = Moments::Empty(in.shape.c);
  const std::vector<double> want =
      NumericGradient(in.x, in.shape, in.w, in.gamma, in.beta, none);
  EXPECT_LT(MaxRelativeError(KernelGradient(in, none, true), want), 1e-4);
}

// Sync BN over W workers: the loss is the sum of all workers' losses; each
// worker's dx comes from its own dy and the globally reduced sums.
TEST(GradientCheckTest, SynchronizedBatchNormAcrossWorkers) {
  const Inputs whole = MakeInputs({9, 2, 3, 2}, 2);
  const std::vector<double> want = NumericGradient(
      whole.x, whole.shape, whole.w, whole.gamma, whole.beta,
      Moments::Empty(whole.shape.c));

  auto kernels = NewCpuBnKernels();
  const std::vector<int64_t> sizes = {4, 0, 5};
  OrderedMerger merger(sizes.size(), whole.shape.c);
  std::vector<Inputs> parts;
  int64_t begin = 0;
  for (size_t p = 0; p < sizes.size(); ++p) {
    Inputs part = whole;
    part.shape.n = sizes[p];
    part.x = reference::SliceBatch(whole.x, whole.shape, begin, begin + sizes[p]);
    part.w = reference::SliceBatch(whole.w, whole.shape, begin, begin + sizes[p]);
    begin += sizes[p];
    ASSERT_TRUE(
        merger.Add(p, *kernels->ComputeMoments(part.x.data(), part.shape)).ok());
    parts.push_back(std::move(part));
  }
  const Moments global = merger.Merge();
  const std::vector<double> var = BiasedVariance(global);
  const Normalization norm{global.mean, var, whole.gamma, whole.beta, kEps};
  BackwardSums sums = BackwardSums::Zero(whole.shape.c);
  for (const Inputs& p : parts) {
    ASSERT_TRUE(
        AddSums(*kernels->BackwardReduce(p.w.data(), p.x.data(), p.shape, norm),
                &sums)
            .ok());
  }
  std::vector<float> dx;
  for (const Inputs& p : parts) {
    std::vector<float> part_dx(p.x.size());
    ASSERT_TRUE(kernels
                    ->BackwardInput(p.w.data(), p.x.data(), p.shape, norm, sums,
                                    global.count, part_dx.data())
                    .ok());
    dx.insert(dx.end(), part_dx.begin(), part_dx.end());
  }
  EXPECT_LT(MaxRelativeError(dx, want), 1e-4);

  // dgamma and dbeta: the reduced sums, checked by differences on gamma, beta.
  for (int64_t c = 0; c < whole.shape.c; ++c) {
    std::vector<double> x(whole.x.begin(), whole.x.end());
    std::vector<float> g_up = whole.gamma, g_down = whole.gamma;
    g_up[c] += kStep;
    g_down[c] -= kStep;
    const Moments none = Moments::Empty(whole.shape.c);
    const double dgamma =
        (Loss(x, whole.shape, whole.w, g_up, whole.beta, none) -
         Loss(x, whole.shape, whole.w, g_down, whole.beta, none)) /
        (static_cast<double>(g_up[c]) - g_down[c]);
    EXPECT_NEAR(sums.sum_dy_xhat[c], dgamma, 1e-3 * (1 + std::fabs(dgamma)));
    std::vector<float> b_up = whole.beta, b_down = whole.beta;
    b_up[c] += kStep;
    b_down[c] -= kStep;
    const double dbeta =
        (Loss(x, whole.shape, whole.w, whole.gamma, b_up, none) -
         Loss(x, whole.shape, whole.w, whole.gamma, b_down, none)) /
        (static_cast<double>(b_up[c]) - b_down[c]);
    EXPECT_NEAR(sums.sum_dy[c], dbeta, 1e-3 * (1 + std::fabs(dbeta)));
  }
}

// Async BN: normalize with merge(own fresh moments, others' constant moments).
// Local sums with the merged count are right; the local count is not.
TEST(GradientCheckTest, AsyncBatchNormWithConstantOthers) {
  const Inputs in = MakeInputs({4, 3, 3, 3}, 3);
  // Other workers' stale moments: a different mean and spread, larger count.
  const Shape other_shape{11, 3, 3, 3};
  const std::vector<float> other_x =
      reference::RandomTensor(other_shape, 1.5, 0.8, 99, -0.2);
  const Moments others =
      *NewCpuBnKernels()->ComputeMoments(other_x.data(), other_shape);

  const std::vector<double> want =
      NumericGradient(in.x, in.shape, in.w, in.gamma, in.beta, others);
  const double err = MaxRelativeError(KernelGradient(in, others, true), want);
  EXPECT_LT(err, 1e-4);
  const double wrong = MaxRelativeError(KernelGradient(in, others, false), want);
  EXPECT_GT(wrong, 1e-2) << "the own-count formula should not pass";
}

// Async with nothing from the others (W = 1, or everyone too stale) is local
// BN: the merge with empty moments must leave the statistics, and so dx, exactly
// those of the batch.
TEST(GradientCheckTest, AsyncWithNoOthersIsLocal) {
  const Inputs in = MakeInputs({6, 2, 2, 2}, 4);
  const std::vector<float> async_dx =
      KernelGradient(in, Moments::Empty(in.shape.c), true);
  const reference::Gradients want =
      reference::Backward(in.w, in.x, in.shape, in.gamma, kEps);
  EXPECT_LT(MaxRelativeError(async_dx, want.dx, 1e-6), 2e-5);
}

}  // namespace
}  // namespace bnps::bn
