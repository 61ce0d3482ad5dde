// Tests of the CUDA backend against the CPU backend, the reference. Without a
// CUDA device every test that needs one is skipped with the runtime's reason.
//
// Tolerances. Convolutions and matrix products sum in float in an order that
// differs between cuDNN / cuBLAS and oneDNN: a few ulps of the largest terms,
// so they are compared to 1e-4 of the largest reference value of the tensor
// (TF32 rounding, ~1e-3, would fail that). Elementwise ops, max pooling and
// the avg-pool gradient do the same float operations on both sides and must
// match bitwise; max-pool gradients use dy in multiples of 1/8, so their sums
// are exact whatever the order. Global average pooling and the bias gradient
// sum in double on both sides, in different orders: 1e-6.

#include "nn/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bn/cuda_kernels.h"
#include "bn/moments.h"
#include "bn/shape.h"
#include "gtest/gtest.h"
#include "nn/backend.h"
#include "nn/cpu_backend.h"

namespace bnps::nn {
namespace {

constexpr double kGemmTolerance = 1e-4;
constexpr double kMeanTolerance = 1e-6;
constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 12345.0f;

std::vector<float> Uniform(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

// Multiples of 1/8 in [-levels/8, levels/8]: sums of a few are exact, and
// with few levels max-pool windows have many ties.
std::vector<float> Eighths(int64_t n, uint32_t seed, int levels) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-levels, levels);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = static_cast<float>(dist(rng)) / 8.0f;
  return v;
}

std::string Describe(const ConvGeometry& g) {
  return absl::StrCat("conv n=", g.n, " c=", g.in_channels, " h=", g.height,
                      " w=", g.width, " k=", g.out_channels,
                      " kernel=", g.kernel, " stride=", g.stride,
                      " pad=", g.pad);
}

std::string Describe(const PoolGeometry& g) {
  return absl::StrCat("pool n=", g.n, " c=", g.channels, " h=", g.height,
                      " w=", g.width, " kernel=", g.kernel,
                      " stride=", g.stride);
}

std::string Describe(const LinearGeometry& g) {
  return absl::StrCat("linear n=", g.n, " in=", g.in, " out=", g.out);
}

// |got - want| <= tolerance * max |want| over the tensor, elementwise.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float v : want)
    scale = std::max(scale, std::abs(static_cast<double>(v)));
  const double bound = tolerance * std::max(scale, 1e-30);
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= bound)) {  // also catches NaN
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want "
                    << want[i] << " (bound " << bound << ")";
      if (++failures == 5) return;
    }
  }
}

void ExpectBitwise(const std::vector<float>& got,
                   const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && !(std::isnan(got[i]) && std::isnan(want[i]))) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want "
                    << want[i];
      if (++failures == 5) return;
    }
  }
}

// Buffers of one backend for one computation: inputs are uploaded, outputs
// start as `fill` (NaN unless given, so an output left unwritten shows). The
// first error sticks in status(). Must not outlive the backend.
class Tensors {
 public:
  explicit Tensors(Backend* backend) : backend_(backend) {}

  float* In(const std::vector<float>& host) { return Put(host); }
  float* Out(int64_t n, float fill = kPoison) {
    return Put(std::vector<float>(static_cast<size_t>(n), fill));
  }

  std::vector<float> Get(const float* p, int64_t n) {
    std::vector<float> host(static_cast<size_t>(n));
    status_.Update(backend_->CopyToHost(p, n, host.data()));
    return host;
  }

  const absl::Status& status() const { return status_; }

 private:
  float* Put(const std::vector<float>& host) {
    const int64_t n = static_cast<int64_t>(host.size());
    absl::StatusOr<Buffer> buf = backend_->Allocate(n);
    if (!buf.ok()) {
      status_.Update(buf.status());
      return nullptr;
    }
    status_.Update(backend_->CopyToDevice(host.data(), n, buf->data()));
    buffers_.push_back(*std::move(buf));
    return buffers_.back().data();
  }

  Backend* backend_;
  std::vector<Buffer> buffers_;
  absl::Status status_;
};

// ---- Each operation family, run on one backend ------------------------------

struct ConvResult {
  std::vector<float> y, dx, dw;
};

absl::StatusOr<ConvResult> RunConv(Backend* b, const ConvGeometry& g,
                                   const std::vector<float>& x,
                                   const std::vector<float>& w,
                                   const std::vector<float>& dy) {
  Tensors t(b);
  const float* dx_in = t.In(x);
  const float* dw_in = t.In(w);
  const float* ddy = t.In(dy);
  float* y = t.Out(g.output_elements());
  float* dx = t.Out(g.input_elements());
  float* dw = t.Out(g.weight_elements());
  if (!t.status().ok()) return t.status();
  if (absl::Status s = b->ConvForward(g, dx_in, dw_in, y); !s.ok()) return s;
  if (absl::Status s = b->ConvBackwardData(g, ddy, dw_in, dx); !s.ok()) {
    return s;
  }
  if (absl::Status s = b->ConvBackwardWeights(g, dx_in, ddy, dw); !s.ok()) {
    return s;
  }
  ConvResult r{t.Get(y, g.output_elements()), t.Get(dx, g.input_elements()),
               t.Get(dw, g.weight_elements())};
  if (!t.status().ok()) return t.status();
  return r;
}

struct LinearResult {
  std::vector<float> y, dx, dw, db;
};

absl::StatusOr<LinearResult> RunLinear(Backend* b, const LinearGeometry& g,
                                       const std::vector<float>& x,
                                       const std::vector<float>& w,
                                       const std::vector<float>& bias,
                                       const std::vector<float>& dy,
                                       bool want_dx) {
  Tensors t(b);
  const float* px = t.In(x);
  const float* pw = t.In(w);
  const float* pb = t.In(bias);
  const float* pdy = t.In(dy);
  float* y = t.Out(g.n * g.out);
  float* dx = want_dx ? t.Out(g.n * g.in) : nullptr;
  float* dw = t.Out(g.out * g.in);
  float* db = t.Out(g.out);
  if (!t.status().ok()) return t.status();
  if (absl::Status s = b->LinearForward(g, px, pw, pb, y); !s.ok()) return s;
  if (absl::Status s = b->LinearBackward(g, pdy, px, pw, dx, dw, db); !s.ok()) {
    return s;
  }
  LinearResult r{t.Get(y, g.n * g.out),
                 want_dx ? t.Get(dx, g.n * g.in) : std::vector<float>(),
                 t.Get(dw, g.out * g.in), t.Get(db, g.out)};
  if (!t.status().ok()) return t.status();
  return r;
}

struct PoolResult {
  std::vector<float> y, dx;
};

absl::StatusOr<PoolResult> RunMaxPool(Backend* b, const PoolGeometry& g,
                                      const std::vector<float>& x,
                                      const std::vector<float>& dy) {
  Tensors t(b);
  const float* px = t.In(x);
  const float* pdy = t.In(dy);
  float* y = t.Out(g.output_elements());
  float* dx = t.Out(g.input_elements());
  if (!t.status().ok()) return t.status();
  if (absl::Status s = b->MaxPoolForward(g, px, y); !s.ok()) return s;
  if (absl::Status s = b->MaxPoolBackward(g, px, pdy, dx); !s.ok()) return s;
  PoolResult r{t.Get(y, g.output_elements()), t.Get(dx, g.input_elements())};
  if (!t.status().ok()) return t.status();
  return r;
}

absl::StatusOr<PoolResult> RunAvgPool(Backend* b, int64_t n, int64_t c,
                                      int64_t hw, const std::vector<float>& x,
                                      const std::vector<float>& dy) {
  Tensors t(b);
  const float* px = t.In(x);
  const float* pdy = t.In(dy);
  float* y = t.Out(n * c);
  float* dx = t.Out(n * c * hw);
  if (!t.status().ok()) return t.status();
  if (absl::Status s = b->GlobalAvgPoolForward(n, c, hw, px, y); !s.ok()) {
    return s;
  }
  if (absl::Status s = b->GlobalAvgPoolBackward(n, c, hw, pdy, dx); !s.ok()) {
    return s;
  }
  PoolResult r{t.Get(y, n * c), t.Get(dx, n * c * hw)};
  if (!t.status().ok()) return t.status();
  return r;
}

// ReLU forward and backward, and a + b, each out of place and in place.
struct ElementwiseResult {
  std::vector<float> relu, relu_in_place, relu_grad, relu_grad_in_place, sum,
      sum_in_place;
};

absl::StatusOr<ElementwiseResult> RunElementwise(Backend* b, int64_t n,
                                                 const std::vector<float>& x,
                                                 const std::vector<float>& dy) {
  Tensors t(b);
  const float* px = t.In(x);
  float* x_copy = t.In(x);
  const float* pdy = t.In(dy);
  float* dy_copy = t.In(dy);
  float* y = t.Out(n);
  float* dx = t.Out(n);
  float* sum = t.Out(n);
  float* a_copy = t.In(x);
  if (!t.status().ok()) return t.status();
  if (absl::Status s = b->ReluForward(n, px, y); !s.ok()) return s;
  if (absl::Status s = b->ReluForward(n, x_copy, x_copy); !s.ok()) return s;
  if (absl::Status s = b->ReluBackward(n, pdy, y, dx); !s.ok()) return s;
  if (absl::Status s = b->ReluBackward(n, dy_copy, y, dy_copy); !s.ok()) {
    return s;
  }
  if (absl::Status s = b->Add(n, px, pdy, sum); !s.ok()) return s;
  if (absl::Status s = b->Add(n, a_copy, pdy, a_copy); !s.ok()) return s;
  ElementwiseResult r{t.Get(y, n),       t.Get(x_copy, n), t.Get(dx, n),
                      t.Get(dy_copy, n), t.Get(sum, n),    t.Get(a_copy, n)};
  if (!t.status().ok()) return t.status();
  return r;
}

// ---- Fixture ----------------------------------------------------------------

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (bn::CudaDeviceCount(&why) == 0) {
      GTEST_SKIP() << "no CUDA device: " << why;
    }
    absl::StatusOr<std::unique_ptr<Backend>> gpu = NewCudaBackend(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = *std::move(gpu);
    cpu_ = NewCpuBackend();
  }

  Backend* gpu() { return gpu_.get(); }
  Backend* cpu() { return cpu_.get(); }

 private:
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
};

// Needs no device: with none, every ordinal is missing.
TEST(CudaBackendNoDeviceTest, MissingDeviceIsFailedPrecondition) {
  const int count = bn::CudaDeviceCount();
  for (int ordinal : {count, -1}) {
    absl::StatusOr<std::unique_ptr<Backend>> b = NewCudaBackend(ordinal);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition)
        << ordinal << ": " << b.status();
    EXPECT_FALSE(b.status().message().empty());
  }
}

TEST_F(CudaBackendTest, NamesTheDevice) {
  EXPECT_EQ(gpu()->name(), "cuda:0");
  EXPECT_EQ(gpu()->bn().name(), "cuda:0");
}

TEST_F(CudaBackendTest, AllocateZeroesAndCopiesRoundTrip) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{123457}}) {
    SCOPED_TRACE(n);
    absl::StatusOr<Buffer> buf = gpu()->Allocate(n);
    ASSERT_TRUE(buf.ok()) << buf.status();
    EXPECT_EQ(buf->size(), n);
    std::vector<float> host(static_cast<size_t>(n), kPoison);
    ASSERT_TRUE(gpu()->CopyToHost(buf->data(), n, host.data()).ok());
    ExpectBitwise(host, std::vector<float>(static_cast<size_t>(n), 0.0f),
                  "fresh buffer");
    const std::vector<float> values = Uniform(n, 1);
    ASSERT_TRUE(gpu()->CopyToDevice(values.data(), n, buf->data()).ok());
    ASSERT_TRUE(gpu()->CopyToHost(buf->data(), n, host.data()).ok());
    ExpectBitwise(host, values, "round trip");
    ASSERT_TRUE(gpu()->Zero(buf->data(), n).ok());
    ASSERT_TRUE(gpu()->CopyToHost(buf->data(), n, host.data()).ok());
    ExpectBitwise(host, std::vector<float>(static_cast<size_t>(n), 0.0f),
                  "zeroed");
  }
}

TEST_F(CudaBackendTest, OutOfMemoryIsResourceExhaustedAndRecoverable) {
  // 4 TiB: more than any GPU has.
  absl::StatusOr<Buffer> huge = gpu()->Allocate(int64_t{1} << 40);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted)
      << huge.status();
  // The failed cudaMalloc must not be reported by the next kernel launch.
  Tensors t(gpu());
  const float* x = t.In(Uniform(100, 2));
  float* y = t.Out(100);
  ASSERT_TRUE(t.status().ok()) << t.status();
  EXPECT_TRUE(gpu()->ReluForward(100, x, y).ok());
}

TEST_F(CudaBackendTest, ConvolutionMatchesCpu) {
  const std::vector<ConvGeometry> geometries = {
      {2, 3, 7, 9, 4, 3, 1, 1},     {3, 5, 8, 8, 6, 3, 2, 1},
      {1, 4, 5, 5, 3, 1, 1, 0},     {2, 6, 9, 7, 5, 1, 2, 0},
      {4, 3, 11, 13, 8, 3, 2, 0},   {1, 1, 3, 3, 1, 3, 1, 0},
      {2, 16, 14, 14, 32, 3, 1, 1}, {5, 7, 1, 1, 3, 1, 1, 0},
      {3, 2, 6, 5, 4, 3, 3, 2},     {8, 32, 28, 28, 16, 3, 1, 1},
      {2, 3, 8, 8, 4, 3, 2, 0},     {1, 3, 10, 7, 2, 1, 3, 0},
  };
  uint32_t seed = 10;
  for (const ConvGeometry& g : geometries) {
    SCOPED_TRACE(Describe(g));
    ASSERT_TRUE(ValidateConvGeometry(g).ok());
    const std::vector<float> x = Uniform(g.input_elements(), ++seed);
    const std::vector<float> w = Uniform(g.weight_elements(), ++seed);
    const std::vector<float> dy = Uniform(g.output_elements(), ++seed);
    absl::StatusOr<ConvResult> want = RunConv(cpu(), g, x, w, dy);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<ConvResult> got = RunConv(gpu(), g, x, w, dy);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectClose(got->y, want->y, kGemmTolerance, "y");
    ExpectClose(got->dx, want->dx, kGemmTolerance, "dx");
    ExpectClose(got->dw, want->dw, kGemmTolerance, "dw");
  }
}

// Only deterministic algorithms, chosen once per geometry: repeated calls give
// the same bits, also with another geometry's calls in between.
TEST_F(CudaBackendTest, ConvolutionIsDeterministicAcrossCalls) {
  const ConvGeometry a{16, 32, 14, 14, 64, 3, 1, 1};
  const ConvGeometry b{4, 8, 9, 9, 8, 3, 2, 0};
  const std::vector<float> x = Uniform(a.input_elements(), 1);
  const std::vector<float> w = Uniform(a.weight_elements(), 2);
  const std::vector<float> dy = Uniform(a.output_elements(), 3);
  absl::StatusOr<ConvResult> first = RunConv(gpu(), a, x, w, dy);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<ConvResult> other =
      RunConv(gpu(), b, Uniform(b.input_elements(), 4),
              Uniform(b.weight_elements(), 5), Uniform(b.output_elements(), 6));
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<ConvResult> second = RunConv(gpu(), a, x, w, dy);
  ASSERT_TRUE(second.ok()) << second.status();
  ExpectBitwise(second->y, first->y, "y");
  ExpectBitwise(second->dx, first->dx, "dx");
  ExpectBitwise(second->dw, first->dw, "dw");
}

// More geometries than the plan cache holds (it starts over): still right.
TEST_F(CudaBackendTest, ConvolutionSurvivesPlanCacheTurnover) {
  for (int64_t n = 1; n <= 70; ++n) {
    const ConvGeometry g{n, 2, 5, 5, 3, 3, 1, 1};
    const std::vector<float> x = Uniform(g.input_elements(), 100 + n);
    const std::vector<float> w = Uniform(g.weight_elements(), 200 + n);
    const std::vector<float> dy = Uniform(g.output_elements(), 300 + n);
    if (n % 10 != 1 && n < 65) {
      // Populate the cache only.
      ASSERT_TRUE(RunConv(gpu(), g, x, w, dy).ok());
      continue;
    }
    SCOPED_TRACE(Describe(g));
    absl::StatusOr<ConvResult> want = RunConv(cpu(), g, x, w, dy);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<ConvResult> got = RunConv(gpu(), g, x, w, dy);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectClose(got->y, want->y, kGemmTolerance, "y");
    ExpectClose(got->dx, want->dx, kGemmTolerance, "dx");
    ExpectClose(got->dw, want->dw, kGemmTolerance, "dw");
  }
}

TEST_F(CudaBackendTest, LinearMatchesCpu) {
  const std::vector<LinearGeometry> geometries = {
      {5, 7, 3},     {1, 1, 1},  {64, 128, 10}, {33, 65, 17},
      {300, 20, 40}, {3, 4, 70}, {1, 512, 1},   {256, 1, 33},
  };
  uint32_t seed = 50;
  for (const LinearGeometry& g : geometries) {
    for (bool want_dx : {true, false}) {
      SCOPED_TRACE(absl::StrCat(Describe(g), want_dx ? " with dx" : " no dx"));
      const std::vector<float> x = Uniform(g.n * g.in, ++seed);
      const std::vector<float> w = Uniform(g.out * g.in, ++seed);
      const std::vector<float> b = Uniform(g.out, ++seed);
      const std::vector<float> dy = Uniform(g.n * g.out, ++seed);
      absl::StatusOr<LinearResult> want =
          RunLinear(cpu(), g, x, w, b, dy, want_dx);
      ASSERT_TRUE(want.ok()) << want.status();
      absl::StatusOr<LinearResult> got =
          RunLinear(gpu(), g, x, w, b, dy, want_dx);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectClose(got->y, want->y, kGemmTolerance, "y");
      ExpectClose(got->dx, want->dx, kGemmTolerance, "dx");
      ExpectClose(got->dw, want->dw, kGemmTolerance, "dw");
      // Both sum the columns in double, in different orders; after rounding
      // to float the difference is at most an ulp.
      ExpectClose(got->db, want->db, 1e-6, "db");
    }
  }
}

TEST_F(CudaBackendTest, LinearIsDeterministicAcrossCalls) {
  const LinearGeometry g{512, 300, 100};
  const std::vector<float> x = Uniform(g.n * g.in, 1);
  const std::vector<float> w = Uniform(g.out * g.in, 2);
  const std::vector<float> b = Uniform(g.out, 3);
  const std::vector<float> dy = Uniform(g.n * g.out, 4);
  absl::StatusOr<LinearResult> first = RunLinear(gpu(), g, x, w, b, dy, true);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<LinearResult> second = RunLinear(gpu(), g, x, w, b, dy, true);
  ASSERT_TRUE(second.ok()) << second.status();
  ExpectBitwise(second->y, first->y, "y");
  ExpectBitwise(second->dx, first->dx, "dx");
  ExpectBitwise(second->dw, first->dw, "dw");
  ExpectBitwise(second->db, first->db, "db");
}

TEST_F(CudaBackendTest, ElementwiseMatchesCpuBitwise) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003},
                    int64_t{1} << 22}) {
    SCOPED_TRACE(n);
    std::vector<float> x = Uniform(n, 7);
    x[0] = 0.0f;  // the boundary: relu(0) = 0 and no gradient
    if (n > 1) x[1] = -0.0f;
    const std::vector<float> dy = Uniform(n, 8);
    absl::StatusOr<ElementwiseResult> want = RunElementwise(cpu(), n, x, dy);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<ElementwiseResult> got = RunElementwise(gpu(), n, x, dy);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectBitwise(got->relu, want->relu, "relu");
    ExpectBitwise(got->relu_in_place, want->relu, "relu in place");
    ExpectBitwise(got->relu_grad, want->relu_grad, "relu grad");
    ExpectBitwise(got->relu_grad_in_place, want->relu_grad,
                  "relu grad in place");
    ExpectBitwise(got->sum, want->sum, "add");
    ExpectBitwise(got->sum_in_place, want->sum, "add in place");
  }
}

TEST_F(CudaBackendTest, MaxPoolMatchesCpuBitwiseTiesIncluded) {
  const std::vector<PoolGeometry> geometries = {
      {2, 3, 6, 6, 2, 2},   {1, 2, 7, 9, 3, 2},   {2, 4, 5, 5, 3, 1},
      {1, 1, 4, 4, 1, 1},   {3, 2, 8, 5, 2, 3},   {1, 1, 1, 1, 1, 1},
      {4, 8, 28, 28, 2, 2}, {2, 3, 13, 11, 4, 3},
  };
  uint32_t seed = 70;
  for (const PoolGeometry& g : geometries) {
    // Continuous inputs, then inputs with 5 levels (ties in most windows).
    for (int levels : {0, 2}) {
      SCOPED_TRACE(absl::StrCat(Describe(g), " levels=", levels));
      ASSERT_TRUE(ValidatePoolGeometry(g).ok());
      const std::vector<float> x =
          levels == 0 ? Uniform(g.input_elements(), ++seed)
                      : Eighths(g.input_elements(), ++seed, levels);
      const std::vector<float> dy = Eighths(g.output_elements(), ++seed, 16);
      absl::StatusOr<PoolResult> want = RunMaxPool(cpu(), g, x, dy);
      ASSERT_TRUE(want.ok()) << want.status();
      absl::StatusOr<PoolResult> got = RunMaxPool(gpu(), g, x, dy);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectBitwise(got->y, want->y, "y");
      ExpectBitwise(got->dx, want->dx, "dx");
    }
  }
}

// The tie rule spelled out, independent of the CPU backend: a window of equal
// values routes its gradient to its first (top-left) element.
TEST_F(CudaBackendTest, MaxPoolTiesGoToTheFirstMaximum) {
  const PoolGeometry g{1, 1, 2, 4, 2, 2};
  Tensors t(gpu());
  const float* x = t.In({1, 3, 5, 5,  //
                         3, 3, 5, 5});
  const float* dy = t.In({10, 20});
  float* dx = t.Out(g.input_elements());
  ASSERT_TRUE(t.status().ok()) << t.status();
  ASSERT_TRUE(gpu()->MaxPoolBackward(g, x, dy, dx).ok());
  ExpectBitwise(t.Get(dx, g.input_elements()), {0, 10, 20, 0, 0, 0, 0, 0},
                "dx");
}

TEST_F(CudaBackendTest, GlobalAvgPoolMatchesCpu) {
  struct Case {
    int64_t n, c, hw;
  };
  uint32_t seed = 90;
  for (const Case& k : {Case{2, 3, 49}, Case{1, 1, 1}, Case{4, 16, 64},
                        Case{3, 5, 1000}, Case{64, 512, 7}}) {
    SCOPED_TRACE(absl::StrCat("n=", k.n, " c=", k.c, " hw=", k.hw));
    const std::vector<float> x = Uniform(k.n * k.c * k.hw, ++seed);
    const std::vector<float> dy = Uniform(k.n * k.c, ++seed);
    absl::StatusOr<PoolResult> want = RunAvgPool(cpu(), k.n, k.c, k.hw, x, dy);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<PoolResult> got = RunAvgPool(gpu(), k.n, k.c, k.hw, x, dy);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectClose(got->y, want->y, kMeanTolerance, "y");
    ExpectBitwise(got->dx, want->dx, "dx");
  }
}

TEST_F(CudaBackendTest, BnKernelsWorkOnBackendMemory) {
  const bn::Shape shape{4, 3, 5, 5};
  const std::vector<float> x = Uniform(shape.Elements(), 11);
  Tensors t(gpu());
  const float* px = t.In(x);
  ASSERT_TRUE(t.status().ok()) << t.status();
  absl::StatusOr<bn::Moments> got = gpu()->bn().ComputeMoments(px, shape);
  ASSERT_TRUE(got.ok()) << got.status();
  absl::StatusOr<bn::Moments> want =
      cpu()->bn().ComputeMoments(x.data(), shape);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(got->count, want->count);
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_NEAR(got->mean[c], want->mean[c], 1e-9);
    EXPECT_NEAR(got->m2[c], want->m2[c], 1e-9);
  }
}

// n == 0: OK with null activations, and outputs (weight gradients included)
// left as they were.
TEST_F(CudaBackendTest, EmptyBatchIsANoOp) {
  const ConvGeometry conv{0, 3, 5, 5, 4, 3, 1, 1};
  const LinearGeometry linear{0, 6, 4};
  const PoolGeometry pool{0, 3, 4, 4, 2, 2};
  Tensors t(gpu());
  const float* w = t.In(Uniform(conv.weight_elements(), 1));
  float* dw = t.Out(conv.weight_elements(), kSentinel);
  const float* lw = t.In(Uniform(linear.out * linear.in, 2));
  const float* lb = t.In(Uniform(linear.out, 3));
  float* ldw = t.Out(linear.out * linear.in, kSentinel);
  float* ldb = t.Out(linear.out, kSentinel);
  ASSERT_TRUE(t.status().ok()) << t.status();

  EXPECT_TRUE(gpu()->ConvForward(conv, nullptr, w, nullptr).ok());
  EXPECT_TRUE(gpu()->ConvBackwardData(conv, nullptr, w, nullptr).ok());
  EXPECT_TRUE(gpu()->ConvBackwardWeights(conv, nullptr, nullptr, dw).ok());
  EXPECT_TRUE(gpu()->LinearForward(linear, nullptr, lw, lb, nullptr).ok());
  EXPECT_TRUE(
      gpu()
          ->LinearBackward(linear, nullptr, nullptr, lw, nullptr, ldw, ldb)
          .ok());
  EXPECT_TRUE(gpu()->ReluForward(0, nullptr, nullptr).ok());
  EXPECT_TRUE(gpu()->ReluBackward(0, nullptr, nullptr, nullptr).ok());
  EXPECT_TRUE(gpu()->MaxPoolForward(pool, nullptr, nullptr).ok());
  EXPECT_TRUE(gpu()->MaxPoolBackward(pool, nullptr, nullptr, nullptr).ok());
  EXPECT_TRUE(gpu()->GlobalAvgPoolForward(0, 3, 9, nullptr, nullptr).ok());
  EXPECT_TRUE(gpu()->GlobalAvgPoolBackward(0, 3, 9, nullptr, nullptr).ok());
  EXPECT_TRUE(gpu()->Add(0, nullptr, nullptr, nullptr).ok());
  EXPECT_TRUE(gpu()->Zero(nullptr, 0).ok());
  EXPECT_TRUE(gpu()->CopyToDevice(nullptr, 0, nullptr).ok());
  EXPECT_TRUE(gpu()->CopyToHost(nullptr, 0, nullptr).ok());

  ExpectBitwise(t.Get(dw, conv.weight_elements()),
                std::vector<float>(conv.weight_elements(), kSentinel), "dw");
  ExpectBitwise(t.Get(ldw, linear.out * linear.in),
                std::vector<float>(linear.out * linear.in, kSentinel), "ldw");
  ExpectBitwise(t.Get(ldb, linear.out),
                std::vector<float>(linear.out, kSentinel), "ldb");
  EXPECT_TRUE(t.status().ok()) << t.status();
}

TEST_F(CudaBackendTest, BadGeometryIsInvalidArgument) {
  Tensors t(gpu());
  const float* in = t.In(Uniform(4096, 1));
  float* out = t.Out(4096);
  ASSERT_TRUE(t.status().ok()) << t.status();
  constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

  for (const ConvGeometry& g : {
           ConvGeometry{-1, 1, 4, 4, 1, 3, 1, 1},  // negative batch
           ConvGeometry{1, 0, 4, 4, 1, 3, 1, 1},   // no channels
           ConvGeometry{1, 1, 4, 4, 1, 3, 0, 1},   // stride 0
           ConvGeometry{1, 1, 4, 4, 1, 3, 1, 3},   // pad >= kernel
           ConvGeometry{1, 1, 2, 2, 1, 5, 1, 1},   // kernel beyond the input
       }) {
    SCOPED_TRACE(Describe(g));
    EXPECT_EQ(gpu()->ConvForward(g, in, in, out).code(), kInvalid);
    EXPECT_EQ(gpu()->ConvBackwardData(g, in, in, out).code(), kInvalid);
    EXPECT_EQ(gpu()->ConvBackwardWeights(g, in, in, out).code(), kInvalid);
  }
  for (const LinearGeometry& g :
       {LinearGeometry{-1, 2, 2}, LinearGeometry{2, 0, 2},
        LinearGeometry{2, 2, 0}}) {
    SCOPED_TRACE(Describe(g));
    EXPECT_EQ(gpu()->LinearForward(g, in, in, in, out).code(), kInvalid);
    EXPECT_EQ(gpu()->LinearBackward(g, in, in, in, out, out, out).code(),
              kInvalid);
  }
  for (const PoolGeometry& g :
       {PoolGeometry{-1, 1, 4, 4, 2, 2}, PoolGeometry{1, 1, 4, 4, 5, 1},
        PoolGeometry{1, 1, 4, 4, 2, 0}, PoolGeometry{1, 0, 4, 4, 2, 2}}) {
    SCOPED_TRACE(Describe(g));
    EXPECT_EQ(gpu()->MaxPoolForward(g, in, out).code(), kInvalid);
    EXPECT_EQ(gpu()->MaxPoolBackward(g, in, in, out).code(), kInvalid);
  }
  EXPECT_EQ(gpu()->GlobalAvgPoolForward(1, 1, 0, in, out).code(), kInvalid);
  EXPECT_EQ(gpu()->GlobalAvgPoolForward(-1, 1, 4, in, out).code(), kInvalid);
  EXPECT_EQ(gpu()->GlobalAvgPoolBackward(1, 0, 4, in, out).code(), kInvalid);
  EXPECT_EQ(gpu()->ReluForward(-1, in, out).code(), kInvalid);
  EXPECT_EQ(gpu()->ReluBackward(-1, in, in, out).code(), kInvalid);
  EXPECT_EQ(gpu()->Add(-1, in, in, out).code(), kInvalid);
  EXPECT_EQ(gpu()->Allocate(-1).status().code(), kInvalid);
  EXPECT_EQ(gpu()->Zero(out, -1).code(), kInvalid);
  EXPECT_EQ(gpu()->CopyToHost(in, -1, out).code(), kInvalid);
}

TEST_F(CudaBackendTest, NullTensorIsInvalidArgument) {
  Tensors t(gpu());
  float* p = t.Out(4096, 0.0f);
  ASSERT_TRUE(t.status().ok()) << t.status();
  constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  const ConvGeometry conv{1, 2, 4, 4, 3, 3, 1, 1};
  EXPECT_EQ(gpu()->ConvForward(conv, nullptr, p, p).code(), kInvalid);
  EXPECT_EQ(gpu()->ConvForward(conv, p, nullptr, p).code(), kInvalid);
  EXPECT_EQ(gpu()->ConvForward(conv, p, p, nullptr).code(), kInvalid);
  EXPECT_EQ(gpu()->ConvBackwardData(conv, nullptr, p, p).code(), kInvalid);
  EXPECT_EQ(gpu()->ConvBackwardWeights(conv, p, p, nullptr).code(), kInvalid);
  // Weights are never empty, so null weights are refused even for n == 0.
  const ConvGeometry empty{0, 2, 4, 4, 3, 3, 1, 1};
  EXPECT_EQ(gpu()->ConvForward(empty, nullptr, nullptr, nullptr).code(),
            kInvalid);

  const LinearGeometry linear{2, 3, 4};
  EXPECT_EQ(gpu()->LinearForward(linear, p, p, nullptr, p).code(), kInvalid);
  EXPECT_EQ(gpu()->LinearForward(linear, nullptr, p, p, p).code(), kInvalid);
  EXPECT_EQ(gpu()->LinearBackward(linear, p, p, p, p, nullptr, p).code(),
            kInvalid);
  EXPECT_EQ(gpu()->LinearBackward(linear, p, p, p, p, p, nullptr).code(),
            kInvalid);
  EXPECT_TRUE(gpu()->LinearBackward(linear, p, p, p, nullptr, p, p).ok())
      << "dx == nullptr means no dx";

  const PoolGeometry pool{1, 1, 4, 4, 2, 2};
  EXPECT_EQ(gpu()->MaxPoolForward(pool, nullptr, p).code(), kInvalid);
  EXPECT_EQ(gpu()->MaxPoolBackward(pool, p, nullptr, p).code(), kInvalid);
  EXPECT_EQ(gpu()->GlobalAvgPoolForward(1, 2, 3, p, nullptr).code(), kInvalid);
  EXPECT_EQ(gpu()->GlobalAvgPoolBackward(1, 2, 3, nullptr, p).code(), kInvalid);
  EXPECT_EQ(gpu()->ReluForward(4, nullptr, p).code(), kInvalid);
  EXPECT_EQ(gpu()->ReluBackward(4, p, nullptr, p).code(), kInvalid);
  EXPECT_EQ(gpu()->Add(4, p, nullptr, p).code(), kInvalid);
  EXPECT_EQ(gpu()->Zero(nullptr, 4).code(), kInvalid);
  EXPECT_EQ(gpu()->CopyToDevice(nullptr, 4, p).code(), kInvalid);
  EXPECT_EQ(gpu()->CopyToHost(p, 4, nullptr).code(), kInvalid);
}

}  // namespace
}  // namespace bnps::nn
