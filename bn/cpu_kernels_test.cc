#include "bn/cpu_kernels.h"

#include <omp.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <vector>

#include "bn/reference.h"
#include "gtest/gtest.h"

namespace bnps::bn {
namespace {

using reference::MaxRelativeError;
using reference::RandomTensor;
using reference::RandomVector;

constexpr double kEps = 1e-5;
constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

struct Case {
  Shape shape;
  double mean;
  double std;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.shape.ToString() << " mean " << c.mean << " std " << c.std;
}

// Shapes of real layers, random shapes, and the edge cases C=1, N=1, H=W=1.
std::vector<Case> Cases() {
  std::vector<Case> cases = {
      {{1, 1, 1, 1}, 0.5, 1.0},     {{1, 3, 1, 1}, 0.0, 1.0},
      {{2, 1, 1, 1}, -1.0, 0.1},    {{1, 4, 5, 5}, 2.0, 3.0},
      {{7, 1, 3, 3}, 0.0, 1.0},     {{32, 10, 1, 1}, 1.0, 2.0},
      {{5, 16, 2, 2}, 0.0, 1.0},    {{8, 64, 7, 7}, 0.3, 1.2},
      {{16, 8, 28, 28}, -0.5, 2.0}, {{32, 24, 1, 1}, 1e4, 1.0},
      {{6, 3, 9, 9}, 1e4, 1.0},
  };
  std::mt19937 rng(42);
  for (int i = 0; i < 12; ++i) {
    const int n = std::uniform_int_distribution<int>(1, 12)(rng);
    const int c = std::uniform_int_distribution<int>(1, 9)(rng);
    const int h = std::uniform_int_distribution<int>(1, 6)(rng);
    const int w = std::uniform_int_distribution<int>(1, 6)(rng);
    cases.push_back({{n, c, h, w},
                     std::uniform_real_distribution<double>(-5, 5)(rng),
                     std::uniform_real_distribution<double>(0.1, 4)(rng)});
  }
  return cases;
}

class CpuKernelsTest : public ::testing::TestWithParam<Case> {
 protected:
  std::unique_ptr<BnKernels> kernels_ = NewCpuBnKernels();
};

TEST_P(CpuKernelsTest, MatchesDoubleReference) {
  const Case& tc = GetParam();
  const Shape& shape = tc.shape;
  const uint64_t seed = shape.Elements() * 31 + shape.c;
  const std::vector<float> x = RandomTensor(shape, tc.mean, tc.std, seed, 0.7);
  const std::vector<float> dy = RandomTensor(shape, 0.1, 1.0, seed + 1);
  const std::vector<float> gamma = RandomVector(shape.c, 0.5, 1.5, seed + 2);
  const std::vector<float> beta = RandomVector(shape.c, -1, 1, seed + 3);
  const reference::Stats want = reference::ComputeStats(x, shape);

  // Statistics.
  absl::StatusOr<Moments> m = kernels_->ComputeMoments(x.data(), shape);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->count, want.count);
  EXPECT_LT(MaxRelativeError(m->mean, want.mean), 1e-12);
  // M2 relative to the scale of the channel's spread.
  EXPECT_LT(MaxRelativeError(m->m2, want.m2, /*floor=*/1e-6), 1e-9);

  // Forward with the reference statistics, so each kernel is checked alone.
  const std::vector<double> var = want.var;
  const Normalization norm{want.mean, var, gamma, beta, kEps};
  std::vector<float> y(x.size(), kPoison);
  ASSERT_TRUE(kernels_->Normalize(x.data(), shape, norm, y.data()).ok());
  const std::vector<double> y_want =
      reference::Normalize(x, shape, want.mean, var, gamma, beta, kEps);
  // Float32 inputs with |mean| = 1e4 carry only ~1e-3 absolute resolution,
  // which the reference sees too; the kernel adds float32 rounding only.
  EXPECT_LT(MaxRelativeError(y, y_want), 2e-6);

  // Backward: local sums and count reproduce whole-batch BN.
  absl::StatusOr<BackwardSums> sums =
      kernels_->BackwardReduce(dy.data(), x.data(), shape, norm);
  ASSERT_TRUE(sums.ok()) << sums.status();
  const reference::Gradients g = reference::Backward(dy, x, shape, gamma, kEps);
  EXPECT_LT(MaxRelativeError(sums->sum_dy, g.dbeta, 1e-6), 1e-9);
  EXPECT_LT(MaxRelativeError(sums->sum_dy_xhat, g.dgamma, 1e-6), 1e-6);
  std::vector<float> dx(x.size(), kPoison);
  ASSERT_TRUE(kernels_
                  ->BackwardInput(dy.data(), x.data(), shape, norm, *sums,
                                  shape.PerChannel(), dx.data())
                  .ok());
  EXPECT_LT(MaxRelativeError(dx, g.dx, 1e-6), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuKernelsTest, ::testing::ValuesIn(Cases()));

TEST(CpuKernelsEdgeTest, EmptyBatch) {
  auto kernels = NewCpuBnKernels();
  const Shape shape{0, 3, 4, 4};
  absl::StatusOr<Moments> m = kernels->ComputeMoments(nullptr, shape);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->count, 0);
  EXPECT_EQ(m->mean, std::vector<double>(3, 0.0));
  const std::vector<double> mean(3, 0.0), var(3, 1.0);
  const std::vector<float> gamma(3, 1.0f), beta(3, 0.0f);
  const Normalization norm{mean, var, gamma, beta, kEps};
  EXPECT_TRUE(kernels->Normalize(nullptr, shape, norm, nullptr).ok());
  absl::StatusOr<BackwardSums> sums =
      kernels->BackwardReduce(nullptr, nullptr, shape, norm);
  ASSERT_TRUE(sums.ok());
  EXPECT_EQ(sums->sum_dy, std::vector<double>(3, 0.0));
  // An empty worker in a synchronized step: global count 10, nothing to write.
  EXPECT_TRUE(
      kernels->BackwardInput(nullptr, nullptr, shape, norm, *sums, 10, nullptr)
          .ok());
}

TEST(CpuKernelsEdgeTest, InPlace) {
  auto kernels = NewCpuBnKernels();
  const Shape shape{3, 2, 2, 5};
  std::vector<float> x = RandomTensor(shape, 1, 1, 1);
  const reference::Stats st = reference::ComputeStats(x, shape);
  const std::vector<float> gamma = {1.5f, 0.5f}, beta = {0.1f, -0.2f};
  const Normalization norm{st.mean, st.var, gamma, beta, kEps};
  const std::vector<double> want =
      reference::Normalize(x, shape, st.mean, st.var, gamma, beta, kEps);
  ASSERT_TRUE(kernels->Normalize(x.data(), shape, norm, x.data()).ok());
  EXPECT_LT(MaxRelativeError(x, want), 1e-6);
}

// Large tensors run on OpenMP threads; the results must not depend on how
// many (each channel is reduced in the same order whatever the split).
TEST(CpuKernelsEdgeTest, BitwiseTheSameForAnyNumberOfThreads) {
  auto kernels = NewCpuBnKernels();
  const Shape shape{16, 24, 14, 14};  // above the OpenMP threshold
  const std::vector<float> x = RandomTensor(shape, 0.5, 2.0, 3, 0.1);
  const std::vector<float> dy = RandomTensor(shape, 0.0, 1.0, 4);
  const std::vector<float> gamma = RandomVector(shape.c, 0.5, 1.5, 5);
  const std::vector<float> beta = RandomVector(shape.c, -0.5, 0.5, 6);
  struct Out {
    Moments m;
    BackwardSums sums;
    std::vector<float> y, dx;
  };
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Out o;
    o.m = *kernels->ComputeMoments(x.data(), shape);
    const std::vector<double> var = BiasedVariance(o.m);
    const Normalization norm{o.m.mean, var, gamma, beta, kEps};
    o.y.resize(x.size());
    o.dx.resize(x.size());
    EXPECT_TRUE(kernels->Normalize(x.data(), shape, norm, o.y.data()).ok());
    o.sums = *kernels->BackwardReduce(dy.data(), x.data(), shape, norm);
    EXPECT_TRUE(kernels
                    ->BackwardInput(dy.data(), x.data(), shape, norm, o.sums,
                                    o.m.count, o.dx.data())
                    .ok());
    return o;
  };
  const Out one = run(1);
  for (int threads : {2, 3}) {
    const Out many = run(threads);
    EXPECT_EQ(one.m.mean, many.m.mean) << threads;
    EXPECT_EQ(one.m.m2, many.m.m2) << threads;
    EXPECT_EQ(one.sums.sum_dy, many.sums.sum_dy) << threads;
    EXPECT_EQ(one.sums.sum_dy_xhat, many.sums.sum_dy_xhat) << threads;
    EXPECT_EQ(one.y, many.y) << threads;
    EXPECT_EQ(one.dx, many.dx) << threads;
  }
}

TEST(CpuKernelsEdgeTest, RejectsBadArguments) {
  auto kernels = NewCpuBnKernels();
  const Shape shape{2, 2, 1, 1};
  const std::vector<float> x = {1, 2, 3, 4}, dy = {1, 1, 1, 1};
  std::vector<float> out(4);
  const std::vector<double> mean = {1, 2}, var = {1, 1}, short_var = {1};
  const std::vector<double> negative_var = {1, -1};
  const std::vector<float> gamma = {1, 1}, beta = {0, 0};
  const auto invalid = absl::StatusCode::kInvalidArgument;

  EXPECT_EQ(kernels->ComputeMoments(x.data(), Shape{2, 0, 1, 1}).status().code(),
            invalid);
  EXPECT_EQ(kernels->ComputeMoments(nullptr, shape).status().code(), invalid);
  EXPECT_EQ(kernels
                ->Normalize(x.data(), shape,
                            Normalization{mean, short_var, gamma, beta, kEps},
                            out.data())
                .code(),
            invalid);
  EXPECT_EQ(kernels
                ->Normalize(x.data(), shape,
                            Normalization{mean, var, gamma, beta, 0.0},
                            out.data())
                .code(),
            invalid);
  EXPECT_EQ(kernels
                ->Normalize(x.data(), shape,
                            Normalization{mean, negative_var, gamma, beta, kEps},
                            out.data())
                .code(),
            invalid);
  EXPECT_EQ(kernels
                ->Normalize(x.data(), shape,
                            Normalization{mean, var, gamma, {}, kEps},
                            out.data())
                .code(),
            invalid);
  const Normalization norm{mean, var, gamma, beta, kEps};
  absl::StatusOr<BackwardSums> sums =
      kernels->BackwardReduce(dy.data(), x.data(), shape, norm);
  ASSERT_TRUE(sums.ok());
  // Count below the local samples per channel.
  EXPECT_EQ(kernels
                ->BackwardInput(dy.data(), x.data(), shape, norm, *sums, 1,
                                out.data())
                .code(),
            invalid);
  BackwardSums wrong = *sums;
  wrong.sum_dy.push_back(0);
  EXPECT_EQ(kernels
                ->BackwardInput(dy.data(), x.data(), shape, norm, wrong, 2,
                                out.data())
                .code(),
            invalid);
}

TEST(CpuKernelsEdgeTest, NonFiniteSumsGiveANonFiniteChannel) {
  // A mixed-precision step whose scaled loss overflowed: the merged sums of a
  // channel are NaN or infinite. Not an error (bn::BackwardSums): that
  // channel's dx is not finite, the others' as with finite sums.
  auto kernels = NewCpuBnKernels();
  const Shape shape{2, 2, 1, 1};  // x[n][c]: channel 0 at 0 and 2
  const std::vector<float> x = {1, 2, 3, 5}, dy = {1, -1, 2, 1};
  const std::vector<double> mean = {2, 3.5}, var = {1, 2.25};
  const std::vector<float> gamma = {1, 2}, beta = {0, 0};
  const Normalization norm{mean, var, gamma, beta, kEps};
  absl::StatusOr<BackwardSums> sums =
      kernels->BackwardReduce(dy.data(), x.data(), shape, norm);
  ASSERT_TRUE(sums.ok());
  std::vector<float> finite(4), poisoned(4);
  ASSERT_TRUE(kernels
                  ->BackwardInput(dy.data(), x.data(), shape, norm, *sums, 2,
                                  finite.data())
                  .ok());
  for (double bad : {static_cast<double>(NAN), static_cast<double>(INFINITY)}) {
    BackwardSums overflowed = *sums;
    overflowed.sum_dy_xhat[0] = bad;
    ASSERT_TRUE(kernels
                    ->BackwardInput(dy.data(), x.data(), shape, norm,
                                    overflowed, 2, poisoned.data())
                    .ok())
        << bad;
    EXPECT_TRUE(!std::isfinite(poisoned[0]) && !std::isfinite(poisoned[2]))
        << bad;
    EXPECT_EQ(poisoned[1], finite[1]) << bad;
    EXPECT_EQ(poisoned[3], finite[3]) << bad;
  }
}

// The backward pass as dx = k1 dy + k2 x + k3 per channel reproduces the
// double reference's dx, with gamma and with ones for an empty gamma.
TEST(InputGradientTest, TheAffineMapGivesTheReferenceDx) {
  const Shape shape{3, 4, 5, 2};
  const std::vector<float> x = RandomTensor(shape, 2.0, 3.0, 7, 0.7);
  const std::vector<float> dy = RandomTensor(shape, 0.1, 1.0, 8);
  const std::vector<float> gamma = RandomVector(shape.c, 0.5, 1.5, 9);
  const reference::Stats st = reference::ComputeStats(x, shape);
  for (bool with_gamma : {true, false}) {
    const std::vector<float> g32 =
        with_gamma ? gamma : std::vector<float>(shape.c, 1.0f);
    const reference::Gradients want =
        reference::Backward(dy, x, shape, g32, kEps);
    const std::vector<double> g64(g32.begin(), g32.end());
    absl::StatusOr<InputGradientMap> k = InputGradient(
        st.mean, st.var,
        with_gamma ? absl::Span<const double>(g64) : absl::Span<const double>(),
        kEps, BackwardSums{want.dbeta, want.dgamma}, st.count);
    ASSERT_TRUE(k.ok()) << k.status();
    std::vector<double> dx(x.size());
    const int64_t len = shape.Spatial();
    for (int64_t p = 0; p < shape.n * shape.c; ++p) {
      const int64_t ch = p % shape.c;
      for (int64_t i = p * len; i < (p + 1) * len; ++i) {
        dx[i] = k->k1[ch] * dy[i] + k->k2[ch] * x[i] + k->k3[ch];
      }
    }
    EXPECT_LT(MaxRelativeError(dx, want.dx, 1e-6), 1e-9) << with_gamma;
  }
  const BackwardSums sums = BackwardSums::Zero(shape.c);
  EXPECT_EQ(InputGradient(st.mean, st.var, {}, kEps, sums, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InputGradient(st.mean, st.var, {}, 0, sums, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InputGradient(st.mean, std::vector<double>(2), {}, kEps, sums, 5)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AddSumsTest, AddsAndRejectsMismatch) {
  BackwardSums acc = BackwardSums::Zero(2);
  BackwardSums part{{1, 2}, {3, 4}};
  ASSERT_TRUE(AddSums(part, &acc).ok());
  ASSERT_TRUE(AddSums(part, &acc).ok());
  EXPECT_EQ(acc.sum_dy, (std::vector<double>{2, 4}));
  EXPECT_EQ(acc.sum_dy_xhat, (std::vector<double>{6, 8}));
  EXPECT_EQ(AddSums(BackwardSums::Zero(3), &acc).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.sum_dy, (std::vector<double>{2, 4}));  // unchanged on error
  // Non-finite values are added as IEEE arithmetic does (bn::BackwardSums).
  part.sum_dy[0] = INFINITY;
  ASSERT_TRUE(AddSums(part, &acc).ok());
  EXPECT_EQ(acc.sum_dy, (std::vector<double>{INFINITY, 6}));
  part.sum_dy[0] = -INFINITY;
  ASSERT_TRUE(AddSums(part, &acc).ok());
  EXPECT_TRUE(std::isnan(acc.sum_dy[0]));
}

TEST(AddSumsTest, AccumulateSumsAddsAsAddSums) {
  BackwardSums checked = BackwardSums::Zero(2);
  BackwardSums accumulated = BackwardSums::Zero(2);
  const BackwardSums part{{0.5, -2}, {3, 1e-3}};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(AddSums(part, &checked).ok());
    AccumulateSums(part, &accumulated);
  }
  EXPECT_EQ(accumulated.sum_dy, checked.sum_dy);
  EXPECT_EQ(accumulated.sum_dy_xhat, checked.sum_dy_xhat);
  EXPECT_EQ(accumulated.sum_dy, (std::vector<double>{1.5, -6}));
}

}  // namespace
}  // namespace bnps::bn
