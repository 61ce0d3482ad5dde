// Tests of the CUDA BN kernels against the CPU kernels (and, for the moments,
// the long-double reference). Without a CUDA device every test that needs one
// is skipped with the runtime's reason.

#include "bn/cuda_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bn/cpu_kernels.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "bn/reference.h"
#include "bn/shape.h"
#include "gtest/gtest.h"

namespace bnps::bn {
namespace {

using reference::RandomTensor;
using reference::RandomVector;

constexpr double kEps = 1e-5;
constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

// Moments and backward sums are accumulated in double on both sides from the
// same float inputs (the products dy * d are exact in double), so they differ
// only in the order of the additions: at most ~count * 2^-53 relative to the
// sum of the magnitudes, below 1e-10 for every shape here, and ~1e-13 in
// practice. A float accumulator anywhere would be off by >= ~1e-7, and with
// |mean| = 1e4 by far more; 1e-9 separates the two with margin on both sides.
constexpr double kReductionTolerance = 1e-9;
// Elementwise outputs use the same float coefficients on both sides; they
// differ by FMA contraction and association, a few float ulps (~1e-7) of the
// scale of the terms that make up an output.
constexpr double kElementwiseTolerance = 1e-5;

struct Case {
  Shape shape;
  double mean;
  double std;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.shape.ToString() << " mean " << c.mean << " std " << c.std;
}

// Real layer shapes, the edge cases (C=1, N=1, H=W=1, N=0, H=0, S not a
// multiple of 4), |mean| >> std, and random shapes.
std::vector<Case> Cases() {
  std::vector<Case> cases = {
      {{32, 64, 28, 28}, 0.3, 1.5}, {{32, 256, 14, 14}, -0.2, 0.7},
      {{7, 3, 5, 5}, 1.0, 2.0},     {{1, 1, 1, 1}, 0.5, 1.0},
      {{1, 5, 3, 3}, -1.0, 0.5},    {{16, 1, 9, 7}, 2.0, 3.0},
      {{1, 1, 64, 64}, 0.0, 1.0},   {{64, 33, 1, 1}, 0.0, 1.0},
      {{2, 7, 1, 1}, 1.0, 1.0},     {{0, 4, 3, 3}, 0.0, 1.0},
      {{3, 2, 0, 5}, 0.0, 1.0},     {{5, 3, 2, 2}, 0.1, 0.2},
      {{3, 2, 17, 20}, -3.0, 1.0},  {{32, 24, 1, 1}, 1e4, 1.0},
      {{6, 3, 9, 9}, 1e4, 1.0},     {{8, 16, 28, 28}, 1e4, 1.0},
      {{4, 8, 12, 12}, -1e4, 1.0},
  };
  std::mt19937 rng(7);
  for (int i = 0; i < 12; ++i) {
    const int n = std::uniform_int_distribution<int>(0, 12)(rng);
    const int c = std::uniform_int_distribution<int>(1, 40)(rng);
    const int h = std::uniform_int_distribution<int>(1, 20)(rng);
    const int w = std::uniform_int_distribution<int>(1, 20)(rng);
    cases.push_back({{n, c, h, w},
                     std::uniform_real_distribution<double>(-5, 5)(rng),
                     std::uniform_real_distribution<double>(0.1, 4)(rng)});
  }
  return cases;
}

// Host copies of a Normalization's vectors.
struct NormData {
  std::vector<double> mean, var;
  std::vector<float> gamma, beta;

  Normalization View() const { return {mean, var, gamma, beta, kEps}; }
};

NormData MakeNorm(const Moments& m, uint64_t seed) {
  const int64_t c = m.channels();
  return {m.mean, BiasedVariance(m), RandomVector(c, 0.5, 1.5, seed),
          RandomVector(c, -1.0, 1.0, seed + 1)};
}

// *buf = a new device buffer with `offset` poison floats, then `host`; the
// tensor starts at buf->floats() + offset.
void Upload(const std::vector<float>& host, DeviceBuffer* buf,
            size_t offset = 0) {
  std::vector<float> padded(offset, kPoison);
  padded.insert(padded.end(), host.begin(), host.end());
  const size_t bytes = padded.size() * sizeof(float);
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Create(0, bytes);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(b->CopyFromHost(padded.data(), bytes).ok());
  *buf = *std::move(b);
}

// A device buffer of `count` NaNs (after `offset` more).
void Poisoned(size_t count, DeviceBuffer* buf, size_t offset = 0) {
  Upload(std::vector<float>(count, kPoison), buf, offset);
}

// The `count` floats at buf.floats() + offset.
void Download(const DeviceBuffer& buf, size_t count, std::vector<float>* out,
              size_t offset = 0) {
  std::vector<float> all(offset + count);
  ASSERT_TRUE(buf.CopyToHost(all.data(), all.size() * sizeof(float)).ok());
  out->assign(all.begin() + offset, all.end());
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float e : v) m = std::max(m, std::fabs(static_cast<double>(e)));
  return m;
}

// Every element written (no poison left) and within tol * scale of want.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 double tol, double scale, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) ||
        std::fabs(static_cast<double>(got[i]) - want[i]) > tol * scale) {
      if (bad++ == 0) first = static_cast<int64_t>(i);
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " bad elements, first at "
                    << first << ": got " << (first >= 0 ? got[first] : 0.0f)
                    << ", want " << (first >= 0 ? want[first] : 0.0f)
                    << " (scale " << scale << ")";
}

bool BitwiseEqual(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Compares moments channel by channel: mean relative to the channel's scale
// max(|mean|, standard deviation), M2 relative to itself.
void ExpectMomentsNear(const Moments& got, int64_t want_count,
                       const std::vector<double>& want_mean,
                       const std::vector<double>& want_m2, const char* what) {
  ASSERT_EQ(got.count, want_count) << what;
  ASSERT_EQ(got.mean.size(), want_mean.size()) << what;
  ASSERT_EQ(got.m2.size(), want_m2.size()) << what;
  for (size_t c = 0; c < want_mean.size(); ++c) {
    const double spread =
        want_count > 0 ? std::sqrt(want_m2[c] / static_cast<double>(want_count))
                       : 0;
    const double mean_scale = std::max(std::fabs(want_mean[c]), spread);
    EXPECT_NEAR(got.mean[c], want_mean[c], kReductionTolerance * mean_scale)
        << what << " channel " << c;
    EXPECT_NEAR(got.m2[c], want_m2[c], kReductionTolerance * want_m2[c])
        << what << " channel " << c;
  }
}

// The scale float rounding in dx = a * dy + b * d + c0 is relative to:
// max |a * dy| + |b * d| + |c0| over the tensor. dx itself can be far smaller
// (with one or two samples per channel the terms cancel to ~0).
double DxScale(const Shape& shape, const NormData& nd, const BackwardSums& sums,
               int64_t count, const std::vector<float>& x,
               const std::vector<float>& dy) {
  double scale = 0;
  for (int64_t c = 0; c < shape.c; ++c) {
    const double inv = 1.0 / std::sqrt(nd.var[c] + kEps);
    const double a = nd.gamma[c] * inv;
    const double b = a * inv * sums.sum_dy_xhat[c] / static_cast<double>(count);
    const double c0 = a * sums.sum_dy[c] / static_cast<double>(count);
    const std::vector<double> xc = reference::Channel(x, shape, c);
    const std::vector<double> dyc = reference::Channel(dy, shape, c);
    for (size_t i = 0; i < xc.size(); ++i) {
      scale = std::max(scale, std::fabs(a * dyc[i]) +
                                  std::fabs(b * (xc[i] - nd.mean[c])) +
                                  std::fabs(c0));
    }
  }
  return scale;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    absl::StatusOr<std::unique_ptr<BnKernels>> k = NewCudaBnKernels(0);
    ASSERT_TRUE(k.ok()) << k.status();
    gpu_ = *std::move(k);
  }

  std::unique_ptr<BnKernels> cpu_ = NewCpuBnKernels();
  std::unique_ptr<BnKernels> gpu_;
};

class CudaCaseTest : public CudaTest,
                     public ::testing::WithParamInterface<Case> {
 protected:
  uint64_t Seed() const {
    const Shape& s = GetParam().shape;
    return static_cast<uint64_t>(s.Elements() * 31 + s.c * 7 + s.h);
  }
};

TEST_P(CudaCaseTest, MomentsMatchCpuAndAreDeterministic) {
  const Case& tc = GetParam();
  const Shape& shape = tc.shape;
  const std::vector<float> xh =
      RandomTensor(shape, tc.mean, tc.std, Seed(), 0.7);
  DeviceBuffer x;
  ASSERT_NO_FATAL_FAILURE(Upload(xh, &x));

  absl::StatusOr<Moments> want = cpu_->ComputeMoments(xh.data(), shape);
  ASSERT_TRUE(want.ok()) << want.status();
  absl::StatusOr<Moments> got = gpu_->ComputeMoments(x.floats(), shape);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(ValidateMoments(*got).ok()) << ValidateMoments(*got);
  ExpectMomentsNear(*got, want->count, want->mean, want->m2, "vs cpu");
  const reference::Stats ref = reference::ComputeStats(xh, shape);
  ExpectMomentsNear(*got, ref.count, ref.mean, ref.m2, "vs long double");

  absl::StatusOr<Moments> again = gpu_->ComputeMoments(x.floats(), shape);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->count, got->count);
  EXPECT_TRUE(BitwiseEqual(again->mean, got->mean));
  EXPECT_TRUE(BitwiseEqual(again->m2, got->m2));
}

TEST_P(CudaCaseTest, NormalizeMatchesCpu) {
  const Case& tc = GetParam();
  const Shape& shape = tc.shape;
  const size_t e = static_cast<size_t>(shape.Elements());
  const std::vector<float> xh =
      RandomTensor(shape, tc.mean, tc.std, Seed(), 0.7);
  absl::StatusOr<Moments> m = cpu_->ComputeMoments(xh.data(), shape);
  ASSERT_TRUE(m.ok()) << m.status();
  const NormData nd = MakeNorm(*m, Seed() + 1);

  std::vector<float> want(e, kPoison);
  ASSERT_TRUE(cpu_->Normalize(xh.data(), shape, nd.View(), want.data()).ok());

  DeviceBuffer x, y;
  ASSERT_NO_FATAL_FAILURE(Upload(xh, &x));
  ASSERT_NO_FATAL_FAILURE(Poisoned(e, &y));
  absl::Status s = gpu_->Normalize(x.floats(), shape, nd.View(), y.floats());
  ASSERT_TRUE(s.ok()) << s;
  std::vector<float> got;
  ASSERT_NO_FATAL_FAILURE(Download(y, e, &got));
  // Relative to the output's scale (at least |beta|: y = beta exactly where
  // x == mean).
  ExpectClose(got, want, kElementwiseTolerance,
              std::max(MaxAbs(want), MaxAbs(nd.beta)), "y");

  // In place (y aliases x): the same values.
  s = gpu_->Normalize(x.floats(), shape, nd.View(), x.floats());
  ASSERT_TRUE(s.ok()) << s;
  std::vector<float> in_place;
  ASSERT_NO_FATAL_FAILURE(Download(x, e, &in_place));
  EXPECT_TRUE(BitwiseEqual(in_place, got));
}

TEST_P(CudaCaseTest, BackwardMatchesCpu) {
  const Case& tc = GetParam();
  const Shape& shape = tc.shape;
  const size_t e = static_cast<size_t>(shape.Elements());
  const std::vector<float> xh =
      RandomTensor(shape, tc.mean, tc.std, Seed(), 0.7);
  const std::vector<float> dyh = RandomTensor(shape, 0.1, 1.0, Seed() + 2);
  absl::StatusOr<Moments> m = cpu_->ComputeMoments(xh.data(), shape);
  ASSERT_TRUE(m.ok()) << m.status();
  const NormData nd = MakeNorm(*m, Seed() + 3);
  const Normalization norm = nd.View();
  DeviceBuffer x, dy;
  ASSERT_NO_FATAL_FAILURE(Upload(xh, &x));
  ASSERT_NO_FATAL_FAILURE(Upload(dyh, &dy));

  // Backward sums, against the scale sum|dy| and sum|dy * x_hat| per channel.
  absl::StatusOr<BackwardSums> want =
      cpu_->BackwardReduce(dyh.data(), xh.data(), shape, norm);
  ASSERT_TRUE(want.ok()) << want.status();
  absl::StatusOr<BackwardSums> got =
      gpu_->BackwardReduce(dy.floats(), x.floats(), shape, norm);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->sum_dy.size(), static_cast<size_t>(shape.c));
  ASSERT_EQ(got->sum_dy_xhat.size(), static_cast<size_t>(shape.c));
  std::vector<double> abs_dy(shape.c, 0.0), abs_dy_xhat(shape.c, 0.0);
  for (int64_t c = 0; c < shape.c; ++c) {
    const double inv = 1.0 / std::sqrt(nd.var[c] + kEps);
    const std::vector<double> xc = reference::Channel(xh, shape, c);
    const std::vector<double> dyc = reference::Channel(dyh, shape, c);
    for (size_t i = 0; i < xc.size(); ++i) {
      abs_dy[c] += std::fabs(dyc[i]);
      abs_dy_xhat[c] += std::fabs(dyc[i] * (xc[i] - nd.mean[c]) * inv);
    }
    EXPECT_NEAR(got->sum_dy[c], want->sum_dy[c],
                kReductionTolerance * abs_dy[c])
        << "channel " << c;
    EXPECT_NEAR(got->sum_dy_xhat[c], want->sum_dy_xhat[c],
                kReductionTolerance * abs_dy_xhat[c])
        << "channel " << c;
  }
  absl::StatusOr<BackwardSums> again =
      gpu_->BackwardReduce(dy.floats(), x.floats(), shape, norm);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(BitwiseEqual(again->sum_dy, got->sum_dy));
  EXPECT_TRUE(BitwiseEqual(again->sum_dy_xhat, got->sum_dy_xhat));

  // dx with the local count (local / sync BN) and a larger one (async BN), from
  // the same sums on both sides.
  for (const int64_t count : {shape.PerChannel(), shape.PerChannel() + 777}) {
    SCOPED_TRACE(count);
    std::vector<float> dx_want(e, kPoison);
    ASSERT_TRUE(cpu_->BackwardInput(dyh.data(), xh.data(), shape, norm, *want,
                                    count, dx_want.data())
                    .ok());
    DeviceBuffer dx;
    ASSERT_NO_FATAL_FAILURE(Poisoned(e, &dx));
    absl::Status s = gpu_->BackwardInput(dy.floats(), x.floats(), shape, norm,
                                         *want, count, dx.floats());
    ASSERT_TRUE(s.ok()) << s;
    std::vector<float> dx_got;
    ASSERT_NO_FATAL_FAILURE(Download(dx, e, &dx_got));
    ExpectClose(dx_got, dx_want, kElementwiseTolerance,
                DxScale(shape, nd, *want, count, xh, dyh), "dx");

    // In place (dx aliases dy): the same values.
    DeviceBuffer dy_copy;
    ASSERT_NO_FATAL_FAILURE(Upload(dyh, &dy_copy));
    s = gpu_->BackwardInput(dy_copy.floats(), x.floats(), shape, norm, *want,
                            count, dy_copy.floats());
    ASSERT_TRUE(s.ok()) << s;
    std::vector<float> in_place;
    ASSERT_NO_FATAL_FAILURE(Download(dy_copy, e, &in_place));
    EXPECT_TRUE(BitwiseEqual(in_place, dx_got));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaCaseTest, ::testing::ValuesIn(Cases()));

// One channel with more samples than the reductions split it into blocks
// (several elements per thread), at |mean| = 1e4 >> std = 1.
TEST_F(CudaTest, LargeChannelWithLargeMean) {
  const Shape shape{3, 2, 600, 600};
  const std::vector<float> xh = RandomTensor(shape, 1e4, 1.0, 11, 3.0);
  DeviceBuffer x;
  ASSERT_NO_FATAL_FAILURE(Upload(xh, &x));
  absl::StatusOr<Moments> got = gpu_->ComputeMoments(x.floats(), shape);
  ASSERT_TRUE(got.ok()) << got.status();
  const reference::Stats ref = reference::ComputeStats(xh, shape);
  ExpectMomentsNear(*got, ref.count, ref.mean, ref.m2, "vs long double");
  // The variance itself, not just M2, is right to ~1e-9: var ~ 1 survives
  // |mean| = 1e4 (float sum / sum of squares would lose it entirely).
  for (int64_t c = 0; c < shape.c; ++c) {
    EXPECT_NEAR(got->m2[c] / got->count, ref.var[c], 1e-9 * ref.var[c]);
  }

  const NormData nd = MakeNorm(*got, 12);
  std::vector<float> want(xh.size());
  ASSERT_TRUE(cpu_->Normalize(xh.data(), shape, nd.View(), want.data()).ok());
  DeviceBuffer y;
  ASSERT_NO_FATAL_FAILURE(Poisoned(xh.size(), &y));
  ASSERT_TRUE(gpu_->Normalize(x.floats(), shape, nd.View(), y.floats()).ok());
  std::vector<float> y_got;
  ASSERT_NO_FATAL_FAILURE(Download(y, xh.size(), &y_got));
  ExpectClose(y_got, want, kElementwiseTolerance, MaxAbs(want), "y");
}

// Tensors that are not 16-byte aligned take the scalar path of the kernels; the
// results are bitwise those of the aligned (float4) path.
TEST_F(CudaTest, ResultsDoNotDependOnAlignment) {
  for (const Shape& shape : {Shape{5, 3, 6, 6}, Shape{4, 2, 8, 8}}) {
    SCOPED_TRACE(shape.ToString());
    const size_t e = static_cast<size_t>(shape.Elements());
    const std::vector<float> xh = RandomTensor(shape, 2.0, 1.0, 21, 0.5);
    const std::vector<float> dyh = RandomTensor(shape, 0.0, 1.0, 22);
    DeviceBuffer xa, xu, dya, dyu;
    ASSERT_NO_FATAL_FAILURE(Upload(xh, &xa));
    ASSERT_NO_FATAL_FAILURE(Upload(xh, &xu, 1));
    ASSERT_NO_FATAL_FAILURE(Upload(dyh, &dya));
    ASSERT_NO_FATAL_FAILURE(Upload(dyh, &dyu, 1));
    float* const x_unaligned = xu.floats() + 1;
    float* const dy_unaligned = dyu.floats() + 1;

    absl::StatusOr<Moments> ma = gpu_->ComputeMoments(xa.floats(), shape);
    absl::StatusOr<Moments> mu = gpu_->ComputeMoments(x_unaligned, shape);
    ASSERT_TRUE(ma.ok() && mu.ok());
    EXPECT_TRUE(BitwiseEqual(ma->mean, mu->mean));
    EXPECT_TRUE(BitwiseEqual(ma->m2, mu->m2));

    const NormData nd = MakeNorm(*ma, 23);
    const Normalization norm = nd.View();
    DeviceBuffer ya, yu;
    ASSERT_NO_FATAL_FAILURE(Poisoned(e, &ya));
    ASSERT_NO_FATAL_FAILURE(Poisoned(e, &yu, 1));
    ASSERT_TRUE(gpu_->Normalize(xa.floats(), shape, norm, ya.floats()).ok());
    ASSERT_TRUE(
        gpu_->Normalize(x_unaligned, shape, norm, yu.floats() + 1).ok());
    std::vector<float> y_aligned, y_unaligned;
    ASSERT_NO_FATAL_FAILURE(Download(ya, e, &y_aligned));
    ASSERT_NO_FATAL_FAILURE(Download(yu, e, &y_unaligned, 1));
    EXPECT_TRUE(BitwiseEqual(y_aligned, y_unaligned));
    EXPECT_TRUE(std::all_of(y_aligned.begin(), y_aligned.end(),
                            [](float v) { return std::isfinite(v); }));

    absl::StatusOr<BackwardSums> sa =
        gpu_->BackwardReduce(dya.floats(), xa.floats(), shape, norm);
    absl::StatusOr<BackwardSums> su =
        gpu_->BackwardReduce(dy_unaligned, x_unaligned, shape, norm);
    ASSERT_TRUE(sa.ok() && su.ok());
    EXPECT_TRUE(BitwiseEqual(sa->sum_dy, su->sum_dy));
    EXPECT_TRUE(BitwiseEqual(sa->sum_dy_xhat, su->sum_dy_xhat));

    DeviceBuffer dxa, dxu;
    ASSERT_NO_FATAL_FAILURE(Poisoned(e, &dxa));
    ASSERT_NO_FATAL_FAILURE(Poisoned(e, &dxu, 1));
    const int64_t count = shape.PerChannel();
    ASSERT_TRUE(gpu_->BackwardInput(dya.floats(), xa.floats(), shape, norm, *sa,
                                    count, dxa.floats())
                    .ok());
    ASSERT_TRUE(gpu_->BackwardInput(dy_unaligned, x_unaligned, shape, norm, *sa,
                                    count, dxu.floats() + 1)
                    .ok());
    std::vector<float> dx_aligned, dx_unaligned;
    ASSERT_NO_FATAL_FAILURE(Download(dxa, e, &dx_aligned));
    ASSERT_NO_FATAL_FAILURE(Download(dxu, e, &dx_unaligned, 1));
    EXPECT_TRUE(BitwiseEqual(dx_aligned, dx_unaligned));
    EXPECT_TRUE(std::all_of(dx_aligned.begin(), dx_aligned.end(),
                            [](float v) { return std::isfinite(v); }));
  }
}

TEST_F(CudaTest, EmptyBatchNeedsNoPointers) {
  const Shape shape{0, 3, 4, 4};
  absl::StatusOr<Moments> m = gpu_->ComputeMoments(nullptr, shape);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->count, 0);
  EXPECT_EQ(m->mean, std::vector<double>(3, 0.0));
  EXPECT_EQ(m->m2, std::vector<double>(3, 0.0));
  const std::vector<double> mean(3, 0.0), var(3, 1.0);
  const std::vector<float> gamma(3, 1.0f), beta(3, 0.0f);
  const Normalization norm{mean, var, gamma, beta, kEps};
  EXPECT_TRUE(gpu_->Normalize(nullptr, shape, norm, nullptr).ok());
  absl::StatusOr<BackwardSums> sums =
      gpu_->BackwardReduce(nullptr, nullptr, shape, norm);
  ASSERT_TRUE(sums.ok()) << sums.status();
  EXPECT_EQ(sums->sum_dy, std::vector<double>(3, 0.0));
  EXPECT_EQ(sums->sum_dy_xhat, std::vector<double>(3, 0.0));
  EXPECT_TRUE(
      gpu_->BackwardInput(nullptr, nullptr, shape, norm, *sums, 10, nullptr)
          .ok());
}

TEST_F(CudaTest, RejectsBadArguments) {
  const Shape shape{2, 2, 1, 1};
  DeviceBuffer x, dy, out;
  ASSERT_NO_FATAL_FAILURE(Upload({1, 2, 3, 4}, &x));
  ASSERT_NO_FATAL_FAILURE(Upload({1, 1, 1, 1}, &dy));
  ASSERT_NO_FATAL_FAILURE(Poisoned(4, &out));
  const std::vector<double> mean = {1, 2}, var = {1, 1}, short_var = {1};
  const std::vector<double> negative_var = {1, -1};
  const std::vector<float> gamma = {1, 1}, beta = {0, 0}, short_gamma = {1};
  const auto invalid = absl::StatusCode::kInvalidArgument;
  float* const xp = x.floats();
  float* const dyp = dy.floats();
  float* const outp = out.floats();

  EXPECT_EQ(gpu_->ComputeMoments(xp, Shape{2, 0, 1, 1}).status().code(),
            invalid);
  EXPECT_EQ(gpu_->ComputeMoments(xp, Shape{-1, 2, 1, 1}).status().code(),
            invalid);
  EXPECT_EQ(gpu_->ComputeMoments(nullptr, shape).status().code(), invalid);

  EXPECT_EQ(
      gpu_->Normalize(xp, shape, {mean, short_var, gamma, beta, kEps}, outp)
          .code(),
      invalid);
  EXPECT_EQ(
      gpu_->Normalize(xp, shape, {mean, var, gamma, beta, 0.0}, outp).code(),
      invalid);
  EXPECT_EQ(
      gpu_->Normalize(xp, shape, {mean, var, gamma, beta, -1.0}, outp).code(),
      invalid);
  EXPECT_EQ(
      gpu_->Normalize(xp, shape, {mean, negative_var, gamma, beta, kEps}, outp)
          .code(),
      invalid);
  EXPECT_EQ(
      gpu_->Normalize(xp, shape, {mean, var, gamma, {}, kEps}, outp).code(),
      invalid);
  EXPECT_EQ(gpu_->Normalize(xp, Shape{2, 0, 1, 1},
                            {mean, var, gamma, beta, kEps}, outp)
                .code(),
            invalid);
  const Normalization norm{mean, var, gamma, beta, kEps};
  EXPECT_EQ(gpu_->Normalize(nullptr, shape, norm, outp).code(), invalid);
  EXPECT_EQ(gpu_->Normalize(xp, shape, norm, nullptr).code(), invalid);

  EXPECT_EQ(
      gpu_->BackwardReduce(dyp, xp, shape, {mean, var, short_gamma, beta, kEps})
          .status()
          .code(),
      invalid);
  EXPECT_EQ(gpu_->BackwardReduce(dyp, xp, shape, {mean, var, gamma, beta, 0.0})
                .status()
                .code(),
            invalid);
  EXPECT_EQ(gpu_->BackwardReduce(nullptr, xp, shape, norm).status().code(),
            invalid);

  absl::StatusOr<BackwardSums> sums =
      gpu_->BackwardReduce(dyp, xp, shape, norm);
  ASSERT_TRUE(sums.ok()) << sums.status();
  // Count below the local samples per channel.
  EXPECT_EQ(gpu_->BackwardInput(dyp, xp, shape, norm, *sums, 1, outp).code(),
            invalid);
  EXPECT_EQ(gpu_->BackwardInput(dyp, xp, shape, norm, *sums, -1, outp).code(),
            invalid);
  BackwardSums wrong = *sums;
  wrong.sum_dy.push_back(0);
  EXPECT_EQ(gpu_->BackwardInput(dyp, xp, shape, norm, wrong, 2, outp).code(),
            invalid);
  wrong = *sums;
  wrong.sum_dy_xhat.pop_back();
  EXPECT_EQ(gpu_->BackwardInput(dyp, xp, shape, norm, wrong, 2, outp).code(),
            invalid);
  EXPECT_EQ(gpu_->BackwardInput(dyp, xp, shape, {mean, var, gamma, beta, 0.0},
                                *sums, 2, outp)
                .code(),
            invalid);
  EXPECT_EQ(gpu_->BackwardInput(dyp, xp, shape, norm, *sums, 2, nullptr).code(),
            invalid);

  // None of the rejected calls wrote anything.
  std::vector<float> untouched;
  ASSERT_NO_FATAL_FAILURE(Download(out, 4, &untouched));
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(),
                          [](float v) { return std::isnan(v); }));
}

// As CpuKernelsEdgeTest.NonFiniteSumsGiveANonFiniteChannel: the merged sums
// of a mixed-precision step that overflowed are not an error; that channel's
// dx is not finite, the other's as with finite sums.
TEST_F(CudaTest, NonFiniteSumsGiveANonFiniteChannel) {
  const Shape shape{2, 2, 1, 1};  // x[n][c]: channel 0 at 0 and 2
  DeviceBuffer x, dy, finite, poisoned;
  ASSERT_NO_FATAL_FAILURE(Upload({1, 2, 3, 5}, &x));
  ASSERT_NO_FATAL_FAILURE(Upload({1, -1, 2, 1}, &dy));
  ASSERT_NO_FATAL_FAILURE(Poisoned(4, &finite));
  ASSERT_NO_FATAL_FAILURE(Poisoned(4, &poisoned));
  const std::vector<double> mean = {2, 3.5}, var = {1, 2.25};
  const std::vector<float> gamma = {1, 2}, beta = {0, 0};
  const Normalization norm{mean, var, gamma, beta, kEps};
  absl::StatusOr<BackwardSums> sums =
      gpu_->BackwardReduce(dy.floats(), x.floats(), shape, norm);
  ASSERT_TRUE(sums.ok()) << sums.status();
  ASSERT_TRUE(gpu_->BackwardInput(dy.floats(), x.floats(), shape, norm, *sums,
                                  2, finite.floats())
                  .ok());
  BackwardSums overflowed = *sums;
  overflowed.sum_dy_xhat[0] = INFINITY;
  ASSERT_TRUE(gpu_->BackwardInput(dy.floats(), x.floats(), shape, norm,
                                  overflowed, 2, poisoned.floats())
                  .ok());
  std::vector<float> want, got;
  ASSERT_NO_FATAL_FAILURE(Download(finite, 4, &want));
  ASSERT_NO_FATAL_FAILURE(Download(poisoned, 4, &got));
  EXPECT_TRUE(!std::isfinite(got[0]) && !std::isfinite(got[2]));
  EXPECT_EQ(got[1], want[1]);
  EXPECT_EQ(got[3], want[3]);
}

TEST_F(CudaTest, NameAndDeviceBuffer) {
  EXPECT_EQ(gpu_->name(), "cuda:0");

  absl::StatusOr<DeviceBuffer> empty = DeviceBuffer::Create(0, 0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_TRUE(empty->CopyFromHost(nullptr, 0).ok());

  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Create(0, 3 * sizeof(float));
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_NE(b->data(), nullptr);
  EXPECT_EQ(b->size(), 3 * sizeof(float));
  const std::vector<float> in = {1.5f, -2.0f, 3.25f};
  ASSERT_TRUE(b->CopyFromHost(in.data(), 12).ok());
  std::vector<float> back(3);
  ASSERT_TRUE(b->CopyToHost(back.data(), 12).ok());
  EXPECT_EQ(back, in);
  EXPECT_EQ(b->CopyFromHost(in.data(), 16).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->CopyToHost(back.data(), 16).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->CopyToHost(nullptr, 4).code(),
            absl::StatusCode::kInvalidArgument);

  DeviceBuffer moved = *std::move(b);
  EXPECT_EQ(moved.size(), 12u);
  ASSERT_TRUE(moved.CopyToHost(back.data(), 12).ok());
  EXPECT_EQ(back, in);
}

// Runs with or without a device.
TEST(CudaDeviceTest, MissingDeviceIsFailedPrecondition) {
  std::string why;
  const int count = CudaDeviceCount(&why);
  EXPECT_GE(count, 0);
  if (count == 0) {
    EXPECT_FALSE(why.empty());
  }
  EXPECT_EQ(NewCudaBnKernels(count).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(NewCudaBnKernels(-1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace bnps::bn
