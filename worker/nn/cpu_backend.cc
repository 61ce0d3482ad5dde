#include "worker/nn/cpu_backend.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bn/cpu_kernels.h"
#include "oneapi/dnnl/dnnl.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace bnps::nn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

// Loops shorter than this stay on one thread: waking the OpenMP team costs
// more than it saves.
constexpr int64_t kParallelThreshold = 1 << 15;

absl::Status NonNull(const void* p, int64_t elements, const char* what) {
  if (p == nullptr && elements > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is null"));
  }
  return absl::OkStatus();
}

absl::Status DnnlError(const dnnl::error& e, const char* what) {
  return absl::InternalError(
      absl::StrCat("oneDNN ", what, ": ", e.what(), " (status ",
                   static_cast<int>(e.status), ")"));
}

using ConvKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t>;

ConvKey KeyOf(const ConvGeometry& g) {
  return {g.n, g.in_channels, g.height, g.width, g.out_channels, g.kernel,
          g.stride, g.pad};
}

// The three primitives of one convolution geometry, on plain NCHW / OIHW
// memory (the BN kernels need NCHW, so no layout conversion per call).
struct ConvPrimitives {
  memory::desc src, weights, dst;
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
};

class CpuBackend : public Backend {
 public:
  CpuBackend()
      : engine_(dnnl::engine::kind::cpu, 0),
        stream_(engine_),
        bn_(bn::NewCpuBnKernels()) {}

  std::string name() const override { return "cpu"; }

  absl::StatusOr<Buffer> Allocate(int64_t n) override {
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot allocate ", n, " floats"));
    }
    if (n == 0) return Buffer();
    // 64-byte alignment suits AVX-512 loads and oneDNN.
    const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory allocating ", n, " floats"));
    }
    std::memset(p, 0, bytes);
    return Buffer(this, static_cast<float*>(p), n);
  }

  absl::Status CopyToDevice(const float* host, int64_t n,
                            float* dst) override {
    return Copy(host, n, dst);
  }
  absl::Status CopyToHost(const float* src, int64_t n, float* host) override {
    return Copy(src, n, host);
  }
  absl::Status Zero(float* dst, int64_t n) override {
    if (n < 0) return absl::InvalidArgumentError("negative element count");
    if (absl::Status s = NonNull(dst, n, "destination"); !s.ok()) return s;
    if (n > 0) std::memset(dst, 0, n * sizeof(float));
    return absl::OkStatus();
  }

  bn::BnKernels& bn() override { return *bn_; }

  absl::Status ConvForward(const ConvGeometry& g, const float* x,
                           const float* w, float* y) override {
    absl::StatusOr<ConvPrimitives*> p = Conv(g, x, w, y);
    if (!p.ok() || g.n == 0) return p.status();
    return Run("convolution forward", [&] {
      (*p)->forward.execute(
          stream_, {{DNNL_ARG_SRC, Mem((*p)->src, x)},
                    {DNNL_ARG_WEIGHTS, Mem((*p)->weights, w)},
                    {DNNL_ARG_DST, Mem((*p)->dst, y)}});
    });
  }

  absl::Status ConvBackwardData(const ConvGeometry& g, const float* dy,
                                const float* w, float* dx) override {
    absl::StatusOr<ConvPrimitives*> p = Conv(g, dx, w, dy);
    if (!p.ok() || g.n == 0) return p.status();
    return Run("convolution backward data", [&] {
      (*p)->backward_data.execute(
          stream_, {{DNNL_ARG_DIFF_DST, Mem((*p)->dst, dy)},
                    {DNNL_ARG_WEIGHTS, Mem((*p)->weights, w)},
                    {DNNL_ARG_DIFF_SRC, Mem((*p)->src, dx)}});
    });
  }

  absl::Status ConvBackwardWeights(const ConvGeometry& g, const float* x,
                                   const float* dy, float* dw) override {
    absl::StatusOr<ConvPrimitives*> p = Conv(g, x, dw, dy);
    if (!p.ok() || g.n == 0) return p.status();
    return Run("convolution backward weights", [&] {
      (*p)->backward_weights.execute(
          stream_, {{DNNL_ARG_SRC, Mem((*p)->src, x)},
                    {DNNL_ARG_DIFF_DST, Mem((*p)->dst, dy)},
                    {DNNL_ARG_DIFF_WEIGHTS, Mem((*p)->weights, dw)}});
    });
  }

  absl::Status LinearForward(const LinearGeometry& g, const float* x,
                             const float* w, const float* b,
                             float* y) override {
    if (absl::Status s = CheckLinear(g, x, w, y); !s.ok()) return s;
    if (absl::Status s = NonNull(b, g.out, "bias"); !s.ok()) return s;
    if (g.n == 0) return absl::OkStatus();
    for (int64_t i = 0; i < g.n; ++i) std::memcpy(y + i * g.out, b, g.out * 4);
    // y[n, out] = x[n, in] * w[out, in]^T + y
    return Gemm('N', 'T', g.n, g.out, g.in, x, g.in, w, g.in, 1.0f, y, g.out);
  }

  absl::Status LinearBackward(const LinearGeometry& g, const float* dy,
                              const float* x, const float* w, float* dx,
                              float* dw, float* db) override {
    if (absl::Status s = CheckLinear(g, x, w, dy); !s.ok()) return s;
    if (absl::Status s = NonNull(dw, g.out * g.in, "dw"); !s.ok()) return s;
    if (absl::Status s = NonNull(db, g.out, "db"); !s.ok()) return s;
    if (g.n == 0) return absl::OkStatus();
    if (dx != nullptr) {
      // dx[n, in] = dy[n, out] * w[out, in]
      absl::Status s =
          Gemm('N', 'N', g.n, g.in, g.out, dy, g.out, w, g.in, 0.0f, dx, g.in);
      if (!s.ok()) return s;
    }
    // dw[out, in] = dy[n, out]^T * x[n, in]
    absl::Status s =
        Gemm('T', 'N', g.out, g.in, g.n, dy, g.out, x, g.in, 0.0f, dw, g.in);
    if (!s.ok()) return s;
    for (int64_t o = 0; o < g.out; ++o) {
      double sum = 0;
      for (int64_t i = 0; i < g.n; ++i) sum += dy[i * g.out + o];
      db[o] = static_cast<float>(sum);
    }
    return absl::OkStatus();
  }

  absl::Status ReluForward(int64_t n, const float* x, float* y) override {
    if (absl::Status s = CheckElementwise(n, x, y); !s.ok()) return s;
#pragma omp parallel for simd if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return absl::OkStatus();
  }

  absl::Status ReluBackward(int64_t n, const float* dy, const float* y,
                            float* dx) override {
    if (absl::Status s = CheckElementwise(n, dy, dx); !s.ok()) return s;
    if (absl::Status s = NonNull(y, n, "y"); !s.ok()) return s;
#pragma omp parallel for simd if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    return absl::OkStatus();
  }

  absl::Status MaxPoolForward(const PoolGeometry& g, const float* x,
                              float* y) override {
    if (absl::Status s = CheckPool(g, x, y); !s.ok()) return s;
    const int64_t ho = g.out_height(), wo = g.out_width();
    const int64_t planes = g.n * g.channels;
#pragma omp parallel for if (g.input_elements() > kParallelThreshold)
    for (int64_t p = 0; p < planes; ++p) {
      const float* xp = x + p * g.height * g.width;
      float* yp = y + p * ho * wo;
      for (int64_t i = 0; i < ho; ++i) {
        for (int64_t j = 0; j < wo; ++j) {
          yp[i * wo + j] = xp[ArgMax(g, xp, i, j)];
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status MaxPoolBackward(const PoolGeometry& g, const float* x,
                               const float* dy, float* dx) override {
    if (absl::Status s = CheckPool(g, x, dy); !s.ok()) return s;
    if (absl::Status s = NonNull(dx, g.input_elements(), "dx"); !s.ok()) {
      return s;
    }
    const int64_t ho = g.out_height(), wo = g.out_width();
    const int64_t planes = g.n * g.channels;
    const int64_t plane = g.height * g.width;
#pragma omp parallel for if (g.input_elements() > kParallelThreshold)
    for (int64_t p = 0; p < planes; ++p) {
      const float* xp = x + p * plane;
      const float* dyp = dy + p * ho * wo;
      float* dxp = dx + p * plane;
      std::memset(dxp, 0, plane * sizeof(float));
      for (int64_t i = 0; i < ho; ++i) {
        for (int64_t j = 0; j < wo; ++j) {
          dxp[ArgMax(g, xp, i, j)] += dyp[i * wo + j];
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status GlobalAvgPoolForward(int64_t n, int64_t c, int64_t hw,
                                    const float* x, float* y) override {
    if (absl::Status s = CheckGap(n, c, hw, x, y); !s.ok()) return s;
    const int64_t planes = n * c;
#pragma omp parallel for if (planes * hw > kParallelThreshold)
    for (int64_t p = 0; p < planes; ++p) {
      const float* xp = x + p * hw;
      double sum = 0;
      for (int64_t i = 0; i < hw; ++i) sum += xp[i];
      y[p] = static_cast<float>(sum / hw);
    }
    return absl::OkStatus();
  }

  absl::Status GlobalAvgPoolBackward(int64_t n, int64_t c, int64_t hw,
                                     const float* dy, float* dx) override {
    if (absl::Status s = CheckGap(n, c, hw, dx, dy); !s.ok()) return s;
    const int64_t planes = n * c;
    const float scale = 1.0f / static_cast<float>(hw);
#pragma omp parallel for if (planes * hw > kParallelThreshold)
    for (int64_t p = 0; p < planes; ++p) {
      const float v = dy[p] * scale;
      std::fill(dx + p * hw, dx + (p + 1) * hw, v);
    }
    return absl::OkStatus();
  }

  absl::Status Add(int64_t n, const float* a, const float* b,
                   float* y) override {
    if (absl::Status s = CheckElementwise(n, a, y); !s.ok()) return s;
    if (absl::Status s = NonNull(b, n, "b"); !s.ok()) return s;
#pragma omp parallel for simd if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
    return absl::OkStatus();
  }

 protected:
  void Free(float* data) override { std::free(data); }

 private:
  static absl::Status Copy(const float* src, int64_t n, float* dst) {
    if (n < 0) return absl::InvalidArgumentError("negative copy size");
    if (absl::Status s = NonNull(src, n, "source"); !s.ok()) return s;
    if (absl::Status s = NonNull(dst, n, "destination"); !s.ok()) return s;
    if (n > 0 && src != dst) std::memmove(dst, src, n * sizeof(float));
    return absl::OkStatus();
  }

  static absl::Status CheckElementwise(int64_t n, const void* in,
                                       const void* out) {
    if (n < 0) return absl::InvalidArgumentError("negative element count");
    if (absl::Status s = NonNull(in, n, "input"); !s.ok()) return s;
    return NonNull(out, n, "output");
  }

  static absl::Status CheckPool(const PoolGeometry& g, const float* in,
                                const float* out) {
    if (absl::Status s = ValidatePoolGeometry(g); !s.ok()) return s;
    if (absl::Status s = NonNull(in, g.input_elements(), "x"); !s.ok()) {
      return s;
    }
    return NonNull(out, g.output_elements(), "pooled tensor");
  }

  static absl::Status CheckGap(int64_t n, int64_t c, int64_t hw,
                               const float* planes, const float* pooled) {
    if (n < 0 || c < 1 || hw < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad global pooling geometry: n=", n, " c=", c, " hw=", hw));
    }
    if (absl::Status s = NonNull(planes, n * c * hw, "planes"); !s.ok()) {
      return s;
    }
    return NonNull(pooled, n * c, "pooled tensor");
  }

  static absl::Status CheckLinear(const LinearGeometry& g, const float* x,
                                  const float* w, const float* y) {
    if (absl::Status s = ValidateLinearGeometry(g); !s.ok()) return s;
    if (absl::Status s = NonNull(x, g.n * g.in, "x"); !s.ok()) return s;
    if (absl::Status s = NonNull(w, g.out * g.in, "w"); !s.ok()) return s;
    return NonNull(y, g.n * g.out, "y");
  }

  // Offset in the plane of the first maximum of output window (i, j).
  static int64_t ArgMax(const PoolGeometry& g, const float* xp, int64_t i,
                        int64_t j) {
    int64_t best = i * g.stride * g.width + j * g.stride;
    for (int64_t a = 0; a < g.kernel; ++a) {
      const int64_t row = (i * g.stride + a) * g.width + j * g.stride;
      for (int64_t b = 0; b < g.kernel; ++b) {
        if (xp[row + b] > xp[best]) best = row + b;
      }
    }
    return best;
  }

  // Row-major C = alpha * op(A) op(B) + beta * C with alpha = 1.
  static absl::Status Gemm(char ta, char tb, int64_t m, int64_t n, int64_t k,
                           const float* a, int64_t lda, const float* b,
                           int64_t ldb, float beta, float* c, int64_t ldc) {
    dnnl_status_t s =
        dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
    if (s != dnnl_success) {
      return absl::InternalError(
          absl::StrCat("oneDNN sgemm failed (status ", static_cast<int>(s),
                       ") for m=", m, " n=", n, " k=", k));
    }
    return absl::OkStatus();
  }

  memory Mem(const memory::desc& md, const float* p) {
    return memory(md, engine_, const_cast<float*>(p));
  }

  template <typename F>
  absl::Status Run(const char* what, F f) {
    try {
      f();
      stream_.wait();
    } catch (const dnnl::error& e) {
      return DnnlError(e, what);
    }
    return absl::OkStatus();
  }

  // Validates and returns the cached primitives of `g`.
  absl::StatusOr<ConvPrimitives*> Conv(const ConvGeometry& g, const float* x,
                                       const float* w, const float* y) {
    if (absl::Status s = ValidateConvGeometry(g); !s.ok()) return s;
    if (absl::Status s = NonNull(x, g.input_elements(), "conv input"); !s.ok()) {
      return s;
    }
    if (absl::Status s = NonNull(w, g.weight_elements(), "conv weights");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = NonNull(y, g.output_elements(), "conv output");
        !s.ok()) {
      return s;
    }
    if (g.n == 0) return nullptr;
    auto it = conv_cache_.find(KeyOf(g));
    if (it != conv_cache_.end()) return it->second.get();
    try {
      auto p = std::make_unique<ConvPrimitives>();
      p->src = memory::desc({g.n, g.in_channels, g.height, g.width}, Dt::f32,
                            Tag::nchw);
      p->weights = memory::desc(
          {g.out_channels, g.in_channels, g.kernel, g.kernel}, Dt::f32,
          Tag::oihw);
      p->dst = memory::desc({g.n, g.out_channels, g.out_height(), g.out_width()},
                            Dt::f32, Tag::nchw);
      const memory::dims strides = {g.stride, g.stride};
      const memory::dims pad = {g.pad, g.pad};
      // The right/bottom padding that makes oneDNN's output size ours.
      const memory::dims pad_r = {
          (g.out_height() - 1) * g.stride + g.kernel - g.height - g.pad,
          (g.out_width() - 1) * g.stride + g.kernel - g.width - g.pad};
      dnnl::convolution_forward::primitive_desc fwd(
          dnnl::convolution_forward::desc(
              dnnl::prop_kind::forward_training,
              dnnl::algorithm::convolution_direct, p->src, p->weights, p->dst,
              strides, pad, pad_r),
          engine_);
      dnnl::convolution_backward_data::primitive_desc bwd_data(
          dnnl::convolution_backward_data::desc(
              dnnl::algorithm::convolution_direct, p->src, p->weights, p->dst,
              strides, pad, pad_r),
          engine_, fwd);
      dnnl::convolution_backward_weights::primitive_desc bwd_weights(
          dnnl::convolution_backward_weights::desc(
              dnnl::algorithm::convolution_direct, p->src, p->weights, p->dst,
              strides, pad, pad_r),
          engine_, fwd);
      p->forward = dnnl::convolution_forward(fwd);
      p->backward_data = dnnl::convolution_backward_data(bwd_data);
      p->backward_weights = dnnl::convolution_backward_weights(bwd_weights);
      ConvPrimitives* raw = p.get();
      conv_cache_.emplace(KeyOf(g), std::move(p));
      return raw;
    } catch (const dnnl::error& e) {
      return DnnlError(e, "convolution setup");
    }
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::unique_ptr<bn::BnKernels> bn_;
  std::map<ConvKey, std::unique_ptr<ConvPrimitives>> conv_cache_;
};

}  // namespace

std::unique_ptr<Backend> NewCpuBackend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace bnps::nn
