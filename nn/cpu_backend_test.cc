// The CPU backend against direct double-precision loops: it is the reference
// of the GPU backend, so it is checked from first principles here.

#include "nn/cpu_backend.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "nn/backend.h"

namespace bnps::nn {
namespace {

std::vector<float> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

void ExpectNear(const std::vector<double>& want, const float* got,
                double tol) {
  double scale = 1e-6;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * scale) << "at " << i;
  }
}

// x[n, ci, h, w] index with zero padding.
double At(const std::vector<float>& x, const ConvGeometry& g, int64_t n,
          int64_t c, int64_t i, int64_t j) {
  if (i < 0 || j < 0 || i >= g.height || j >= g.width) return 0.0;
  return x[((n * g.in_channels + c) * g.height + i) * g.width + j];
}

struct ConvRef {
  std::vector<double> y, dx, dw;
};

ConvRef ReferenceConv(const ConvGeometry& g, const std::vector<float>& x,
                      const std::vector<float>& w,
                      const std::vector<float>& dy) {
  ConvRef r;
  const int64_t ho = g.out_height(), wo = g.out_width(), k = g.kernel;
  r.y.assign(g.output_elements(), 0.0);
  r.dx.assign(g.input_elements(), 0.0);
  r.dw.assign(g.weight_elements(), 0.0);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.out_channels; ++o)
      for (int64_t i = 0; i < ho; ++i)
        for (int64_t j = 0; j < wo; ++j) {
          const int64_t yi = ((n * g.out_channels + o) * ho + i) * wo + j;
          for (int64_t c = 0; c < g.in_channels; ++c)
            for (int64_t a = 0; a < k; ++a)
              for (int64_t b = 0; b < k; ++b) {
                const int64_t xi = i * g.stride + a - g.pad;
                const int64_t xj = j * g.stride + b - g.pad;
                const int64_t wi = ((o * g.in_channels + c) * k + a) * k + b;
                r.y[yi] += w[wi] * At(x, g, n, c, xi, xj);
                r.dw[wi] += dy[yi] * At(x, g, n, c, xi, xj);
                if (xi >= 0 && xj >= 0 && xi < g.height && xj < g.width) {
                  r.dx[((n * g.in_channels + c) * g.height + xi) * g.width +
                       xj] += dy[yi] * w[wi];
                }
              }
        }
  return r;
}

class CpuBackendTest : public ::testing::Test {
 protected:
  Buffer Upload(const std::vector<float>& v) {
    absl::StatusOr<Buffer> b = backend_->Allocate(v.size());
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(backend_->CopyToDevice(v.data(), v.size(), b->data()).ok());
    return *std::move(b);
  }
  Buffer Zeros(int64_t n) { return *backend_->Allocate(n); }

  std::unique_ptr<Backend> backend_ = NewCpuBackend();
};

TEST_F(CpuBackendTest, ConvolutionMatchesDirectLoops) {
  const ConvGeometry geometries[] = {
      {2, 3, 7, 6, 4, 3, 1, 1},  // odd sizes, same padding
      {3, 2, 9, 9, 5, 3, 2, 1},  // stride 2
      {2, 4, 5, 5, 3, 1, 1, 0},  // 1x1
      {1, 1, 6, 8, 2, 3, 2, 0},  // no padding, stride 2, uneven output
      // The default model's geometries, which run on oneDNN's blocked
      // layouts (with reorders) rather than plain NCHW.
      {3, 1, 28, 28, 16, 3, 1, 1},
      {2, 16, 14, 14, 16, 3, 1, 1},
      {2, 16, 14, 14, 32, 3, 2, 1},
      {2, 32, 7, 7, 32, 3, 1, 1},
  };
  uint64_t seed = 1;
  for (const ConvGeometry& g : geometries) {
    SCOPED_TRACE(testing::Message() << "n=" << g.n << " ci=" << g.in_channels
                                    << " h=" << g.height << " k=" << g.kernel
                                    << " s=" << g.stride << " p=" << g.pad);
    const std::vector<float> x = Random(g.input_elements(), seed++);
    const std::vector<float> w = Random(g.weight_elements(), seed++);
    const std::vector<float> dy = Random(g.output_elements(), seed++);
    const ConvRef ref = ReferenceConv(g, x, w, dy);
    Buffer bx = Upload(x), bw = Upload(w), bdy = Upload(dy);
    Buffer y = Zeros(g.output_elements()), dx = Zeros(g.input_elements()),
           dw = Zeros(g.weight_elements());
    ASSERT_TRUE(backend_->ConvForward(g, bx.data(), bw.data(), y.data()).ok());
    ASSERT_TRUE(
        backend_->ConvBackwardData(g, bdy.data(), bw.data(), dx.data()).ok());
    ASSERT_TRUE(
        backend_->ConvBackwardWeights(g, bx.data(), bdy.data(), dw.data()).ok());
    ExpectNear(ref.y, y.data(), 1e-5);
    ExpectNear(ref.dx, dx.data(), 1e-5);
    ExpectNear(ref.dw, dw.data(), 1e-5);
  }
}

TEST_F(CpuBackendTest, LinearMatchesDirectLoops) {
  const LinearGeometry g{5, 7, 3};
  const std::vector<float> x = Random(g.n * g.in, 1), w = Random(g.out * g.in, 2),
                           b = Random(g.out, 3), dy = Random(g.n * g.out, 4);
  std::vector<double> y(g.n * g.out), dx(g.n * g.in, 0.0),
      dw(g.out * g.in, 0.0), db(g.out, 0.0);
  for (int64_t i = 0; i < g.n; ++i)
    for (int64_t o = 0; o < g.out; ++o) {
      y[i * g.out + o] = b[o];
      db[o] += dy[i * g.out + o];
      for (int64_t k = 0; k < g.in; ++k) {
        y[i * g.out + o] += x[i * g.in + k] * w[o * g.in + k];
        dx[i * g.in + k] += dy[i * g.out + o] * w[o * g.in + k];
        dw[o * g.in + k] += dy[i * g.out + o] * x[i * g.in + k];
      }
    }
  Buffer bx = Upload(x), bw = Upload(w), bb = Upload(b), bdy = Upload(dy);
  Buffer by = Zeros(g.n * g.out), bdx = Zeros(g.n * g.in),
         bdw = Zeros(g.out * g.in), bdb = Zeros(g.out);
  ASSERT_TRUE(
      backend_->LinearForward(g, bx.data(), bw.data(), bb.data(), by.data())
          .ok());
  ASSERT_TRUE(backend_
                  ->LinearBackward(g, bdy.data(), bx.data(), bw.data(),
                                   bdx.data(), bdw.data(), bdb.data())
                  .ok());
  ExpectNear(y, by.data(), 1e-5);
  ExpectNear(dx, bdx.data(), 1e-5);
  ExpectNear(dw, bdw.data(), 1e-5);
  ExpectNear(db, bdb.data(), 1e-5);
  // dx is optional.
  EXPECT_TRUE(backend_
                  ->LinearBackward(g, bdy.data(), bx.data(), bw.data(), nullptr,
                                   bdw.data(), bdb.data())
                  .ok());
}

TEST_F(CpuBackendTest, MaxPoolRoutesTiesToTheFirstMaximum) {
  const PoolGeometry g{1, 1, 4, 4, 2, 2};
  // Window (0, 0) has a tie between offsets 1 and 4 (row-major order: (0,1)
  // comes first).
  const std::vector<float> x = {0, 5, 1, 2,  //
                                5, 1, 3, 3,  //
                                -1, -2, 7, 0,  //
                                -3, -1, 0, 7};
  Buffer bx = Upload(x), y = Zeros(4), dx = Zeros(16);
  ASSERT_TRUE(backend_->MaxPoolForward(g, bx.data(), y.data()).ok());
  EXPECT_EQ(std::vector<float>(y.data(), y.data() + 4),
            (std::vector<float>{5, 3, -1, 7}));
  Buffer dy = Upload({1, 2, 3, 4});
  ASSERT_TRUE(backend_->MaxPoolBackward(g, bx.data(), dy.data(), dx.data()).ok());
  EXPECT_EQ(std::vector<float>(dx.data(), dx.data() + 16),
            (std::vector<float>{0, 1, 0, 0,  //
                                0, 0, 2, 0,  //
                                3, 0, 4, 0,  //
                                0, 0, 0, 0}));
}

TEST_F(CpuBackendTest, ElementwiseAndGlobalPooling) {
  const std::vector<float> a = {-1, 2, 0, 3.5f, -0.5f, 4};
  const std::vector<float> b = {1, 1, 1, 1, 1, 1};
  Buffer ba = Upload(a), bb = Upload(b), y = Zeros(6), dx = Zeros(6);
  ASSERT_TRUE(backend_->ReluForward(6, ba.data(), y.data()).ok());
  EXPECT_EQ(std::vector<float>(y.data(), y.data() + 6),
            (std::vector<float>{0, 2, 0, 3.5f, 0, 4}));
  ASSERT_TRUE(backend_->ReluBackward(6, bb.data(), y.data(), dx.data()).ok());
  EXPECT_EQ(std::vector<float>(dx.data(), dx.data() + 6),
            (std::vector<float>{0, 1, 0, 1, 0, 1}));
  ASSERT_TRUE(backend_->Add(6, ba.data(), bb.data(), y.data()).ok());
  EXPECT_EQ(y.data()[0], 0.0f);
  EXPECT_EQ(y.data()[5], 5.0f);
  // [n=1, c=2, hw=3]
  Buffer pooled = Zeros(2);
  ASSERT_TRUE(
      backend_->GlobalAvgPoolForward(1, 2, 3, ba.data(), pooled.data()).ok());
  EXPECT_FLOAT_EQ(pooled.data()[0], 1.0f / 3);
  EXPECT_FLOAT_EQ(pooled.data()[1], 7.0f / 3);
  Buffer g = Upload({3, 6});
  ASSERT_TRUE(backend_->GlobalAvgPoolBackward(1, 2, 3, g.data(), dx.data()).ok());
  EXPECT_EQ(std::vector<float>(dx.data(), dx.data() + 6),
            (std::vector<float>{1, 1, 1, 2, 2, 2}));
}

TEST_F(CpuBackendTest, EmptyBatchIsANoOp) {
  ConvGeometry g{0, 2, 5, 5, 3, 3, 1, 1};
  Buffer w = Upload(Random(g.weight_elements(), 1));
  EXPECT_TRUE(backend_->ConvForward(g, nullptr, w.data(), nullptr).ok());
  EXPECT_TRUE(backend_->ConvBackwardData(g, nullptr, w.data(), nullptr).ok());
  EXPECT_TRUE(backend_->ReluForward(0, nullptr, nullptr).ok());
  EXPECT_TRUE(
      backend_->MaxPoolForward(PoolGeometry{0, 2, 4, 4, 2, 2}, nullptr, nullptr)
          .ok());
}

TEST_F(CpuBackendTest, BadInputIsRejected) {
  Buffer w = Zeros(100), x = Zeros(100), y = Zeros(100);
  ConvGeometry bad{1, 1, 2, 2, 1, 5, 1, 0};  // kernel larger than the image
  EXPECT_EQ(backend_->ConvForward(bad, x.data(), w.data(), y.data()).code(),
            absl::StatusCode::kInvalidArgument);
  ConvGeometry ok{1, 1, 4, 4, 1, 3, 1, 1};
  EXPECT_EQ(backend_->ConvForward(ok, nullptr, w.data(), y.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_
                ->LinearForward(LinearGeometry{1, 0, 2}, x.data(), w.data(),
                                w.data(), y.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_
                ->MaxPoolForward(PoolGeometry{1, 1, 1, 1, 2, 2}, x.data(),
                                 y.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->Allocate(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bnps::nn
