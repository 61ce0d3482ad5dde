#include "nn/cpu_backend.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "util/cpu_clones.h"
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

// One argument of a convolution primitive: the caller's memory (plain NCHW /
// OIHW, its pointer set per call) and, when the primitive works in another
// layout (oneDNN's blocked formats, e.g. nChw16c), the primitive's own memory
// and the reorder between the two, run before the primitive for an input and
// after it for an output. The BN kernels and every other operation need NCHW,
// so layouts never leak out of a call.
struct ConvArg {
  int arg = 0;  // DNNL_ARG_*
  bool output = false;
  bool reordered = false;
  memory user;
  memory inner;  // the same object as `user` unless reordered
  dnnl::reorder reorder;  // user -> inner (input) or inner -> user (output)
};

// One of the three operations of a geometry, ready to run.
struct ConvOp {
  dnnl::primitive primitive;
  std::vector<ConvArg> args;
  std::unordered_map<int, memory> exec_args;  // arg -> inner memory
};

// The three operations of one convolution geometry.
struct ConvPrimitives {
  ConvOp forward, backward_data, backward_weights;
};

// Whether an operation runs in oneDNN's preferred (blocked) layouts with
// reorders, rather than directly on NCHW. On NCHW oneDNN takes im2col + GEMM,
// which is 2-3x slower than its direct blocked kernels for the model's
// convolutions even counting the reorders; with 2 or 3 input channels the
// direct kernels lose for the forward pass, and below 4 input channels for
// the backward-data pass (the blocked input gradient is padded to 16
// channels). Fixed by geometry, never by timing, so results are reproducible
// from run to run.
enum class ConvOpKind { kForward, kBackwardData, kBackwardWeights };

bool PreferBlocked(ConvOpKind kind, const ConvGeometry& g) {
  switch (kind) {
    case ConvOpKind::kForward:
      return g.in_channels == 1 || g.in_channels >= 4;
    case ConvOpKind::kBackwardData:
      return g.in_channels >= 4;
    case ConvOpKind::kBackwardWeights:
      return true;
  }
  return false;
}

// True when the blocked variant is one of oneDNN's direct JIT kernels (on a
// CPU without AVX2 it may fall back to GEMM or a reference kernel, which only
// adds reorders).
bool IsDirectJit(const char* impl) {
  const std::string s = impl == nullptr ? "" : impl;
  return s.rfind("jit", 0) == 0 || s.find("brg") != std::string::npos;
}

// The hot loops of 2x2 max pooling are compiled for x86-64-v3 (AVX2) and for
// the baseline, picked at load time (BNPS_HOT_LOOP, util/cpu_clones.h).

// 2x2 windows at stride 2 over rows a and b: y[j] = the first maximum of
// (a[2j], a[2j+1], b[2j], b[2j+1]) in that (row-major) order, with the strict
// comparisons of the general path (CpuBackend::ArgMax), so the value is
// bitwise the same, signed zeros and NaNs included. Branch-free, so it
// vectorizes.
BNPS_HOT_LOOP
void Pool2x2RowForward(const float* a, const float* b, int64_t wo, float* y) {
#pragma omp simd
  for (int64_t j = 0; j < wo; ++j) {
    const float v0 = a[2 * j], v1 = a[2 * j + 1], v2 = b[2 * j],
                v3 = b[2 * j + 1];
    const float m1 = v1 > v0 ? v1 : v0;
    const float m2 = v2 > m1 ? v2 : m1;
    y[j] = v3 > m2 ? v3 : m2;
  }
}

// The gradient of Pool2x2RowForward: dy[j] goes to the first maximum of its
// window, zeros to the other three elements.
BNPS_HOT_LOOP
void Pool2x2RowBackward(const float* a, const float* b, const float* dy,
                        int64_t wo, float* da, float* db) {
#pragma omp simd
  for (int64_t j = 0; j < wo; ++j) {
    const float v0 = a[2 * j], v1 = a[2 * j + 1], v2 = b[2 * j],
                v3 = b[2 * j + 1];
    // The index of the first maximum, as a float so that every step is a
    // select of the same width (which the vectorizer handles).
    const float m1 = v1 > v0 ? v1 : v0;
    float k = v1 > v0 ? 1.0f : 0.0f;
    const float m2 = v2 > m1 ? v2 : m1;
    k = v2 > m1 ? 2.0f : k;
    k = v3 > m2 ? 3.0f : k;
    // As 0 + dy in the general path (which turns -0 into +0).
    const float g = dy[j] + 0.0f;
    da[2 * j] = k == 0.0f ? g : 0.0f;
    da[2 * j + 1] = k == 1.0f ? g : 0.0f;
    db[2 * j] = k == 2.0f ? g : 0.0f;
    db[2 * j + 1] = k == 3.0f ? g : 0.0f;
  }
}

class CpuBackend : public Backend {
 public:
  CpuBackend()
      : engine_(dnnl::engine::kind::cpu, 0),
        stream_(engine_),
        bn_(bn::NewCpuBnKernels()) {}

  std::string name() const override { return "cpu"; }

  bn::BnKernels& bn() override { return *bn_; }

 protected:
  void Free(float* data) override { std::free(data); }

 private:
  // The arguments were checked by Backend (backend.h); n > 0 throughout.

  absl::StatusOr<Buffer> DoAllocate(int64_t n) override {
    // 64-byte alignment suits AVX-512 loads and oneDNN. Backend::Allocate
    // has ruled out byte counts beyond int64_t, so `bytes` cannot wrap.
    const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory allocating ", n, " floats"));
    }
    std::memset(p, 0, bytes);
    return Buffer(this, static_cast<float*>(p), n);
  }

  absl::Status DoCopyToDevice(const float* host, int64_t n,
                              float* dst) override {
    return Copy(host, n, dst);
  }
  absl::Status DoCopyToHost(const float* src, int64_t n, float* host) override {
    return Copy(src, n, host);
  }
  absl::Status DoZero(float* dst, int64_t n) override {
    std::memset(dst, 0, n * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status DoConvForward(const ConvGeometry& g, const float* x,
                             const float* w, float* y) override {
    absl::StatusOr<ConvPrimitives*> p = Conv(g);
    if (!p.ok()) return p.status();
    return Execute("convolution forward", (*p)->forward, {x, w, y});
  }

  absl::Status DoConvBackwardData(const ConvGeometry& g, const float* dy,
                                  const float* w, float* dx) override {
    absl::StatusOr<ConvPrimitives*> p = Conv(g);
    if (!p.ok()) return p.status();
    return Execute("convolution backward data", (*p)->backward_data,
                   {dy, w, dx});
  }

  absl::Status DoConvBackwardWeights(const ConvGeometry& g, const float* x,
                                     const float* dy, float* dw) override {
    absl::StatusOr<ConvPrimitives*> p = Conv(g);
    if (!p.ok()) return p.status();
    return Execute("convolution backward weights", (*p)->backward_weights,
                   {x, dy, dw});
  }

  absl::Status DoLinearForward(const LinearGeometry& g, const float* x,
                               const float* w, const float* b,
                               float* y) override {
    for (int64_t i = 0; i < g.n; ++i) std::memcpy(y + i * g.out, b, g.out * 4);
    // y[n, out] = x[n, in] * w[out, in]^T + y
    return Gemm('N', 'T', g.n, g.out, g.in, x, g.in, w, g.in, 1.0f, y, g.out);
  }

  absl::Status DoLinearBackward(const LinearGeometry& g, const float* dy,
                                const float* x, const float* w, float* dx,
                                float* dw, float* db) override {
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

  absl::Status DoReluForward(int64_t n, const float* x, float* y) override {
#pragma omp parallel for simd if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return absl::OkStatus();
  }

  absl::Status DoReluBackward(int64_t n, const float* dy, const float* y,
                              float* dx) override {
    // dy is loaded unconditionally so the select vectorizes (a branch on the
    // sign of y mispredicts half the time).
#pragma omp parallel for simd if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) {
      const float g = dy[i];
      dx[i] = y[i] > 0.0f ? g : 0.0f;
    }
    return absl::OkStatus();
  }

  absl::Status DoMaxPoolForward(const PoolGeometry& g, const float* x,
                                float* y) override {
    const int64_t ho = g.out_height(), wo = g.out_width();
    const int64_t planes = g.n * g.channels;
    const bool two = g.kernel == 2 && g.stride == 2;
#pragma omp parallel for if (g.input_elements() > kParallelThreshold)
    for (int64_t p = 0; p < planes; ++p) {
      const float* xp = x + p * g.height * g.width;
      float* yp = y + p * ho * wo;
      for (int64_t i = 0; i < ho; ++i) {
        if (two) {
          Pool2x2RowForward(xp + 2 * i * g.width, xp + (2 * i + 1) * g.width,
                            wo, yp + i * wo);
          continue;
        }
        for (int64_t j = 0; j < wo; ++j) {
          yp[i * wo + j] = xp[ArgMax(g, xp, i, j)];
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status DoMaxPoolBackward(const PoolGeometry& g, const float* x,
                                 const float* dy, float* dx) override {
    const int64_t ho = g.out_height(), wo = g.out_width();
    const int64_t planes = g.n * g.channels;
    const int64_t plane = g.height * g.width;
    const bool two = g.kernel == 2 && g.stride == 2;
#pragma omp parallel for if (g.input_elements() > kParallelThreshold)
    for (int64_t p = 0; p < planes; ++p) {
      const float* xp = x + p * plane;
      const float* dyp = dy + p * ho * wo;
      float* dxp = dx + p * plane;
      if (two) {
        // Non-overlapping windows: every covered element is written once;
        // only a last odd row or column needs zeros.
        for (int64_t i = 0; i < ho; ++i) {
          const int64_t r0 = 2 * i * g.width, r1 = r0 + g.width;
          Pool2x2RowBackward(xp + r0, xp + r1, dyp + i * wo, wo, dxp + r0,
                             dxp + r1);
          for (int64_t j = 2 * wo; j < g.width; ++j) {
            dxp[r0 + j] = 0;
            dxp[r1 + j] = 0;
          }
        }
        if (g.height > 2 * ho) {
          std::memset(dxp + 2 * ho * g.width, 0,
                      (g.height - 2 * ho) * g.width * sizeof(float));
        }
        continue;
      }
      std::memset(dxp, 0, plane * sizeof(float));
      for (int64_t i = 0; i < ho; ++i) {
        for (int64_t j = 0; j < wo; ++j) {
          dxp[ArgMax(g, xp, i, j)] += dyp[i * wo + j];
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status DoGlobalAvgPoolForward(int64_t n, int64_t c, int64_t hw,
                                      const float* x, float* y) override {
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

  absl::Status DoGlobalAvgPoolBackward(int64_t n, int64_t c, int64_t hw,
                                       const float* dy, float* dx) override {
    const int64_t planes = n * c;
    const float scale = 1.0f / static_cast<float>(hw);
#pragma omp parallel for if (planes * hw > kParallelThreshold)
    for (int64_t p = 0; p < planes; ++p) {
      const float v = dy[p] * scale;
      std::fill(dx + p * hw, dx + (p + 1) * hw, v);
    }
    return absl::OkStatus();
  }

  absl::Status DoAdd(int64_t n, const float* a, const float* b,
                     float* y) override {
#pragma omp parallel for simd if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
    return absl::OkStatus();
  }

  static absl::Status Copy(const float* src, int64_t n, float* dst) {
    if (src != dst) std::memmove(dst, src, n * sizeof(float));
    return absl::OkStatus();
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

  // Runs `op` on the caller's pointers (in the order of op.args): reorders
  // the inputs into the primitive's layouts, runs it, reorders the outputs
  // back.
  absl::Status Execute(const char* what, ConvOp& op,
                       std::initializer_list<const float*> data) {
    return Run(what, [&] {
      auto d = data.begin();
      for (ConvArg& a : op.args) {
        a.user.set_data_handle(const_cast<float*>(*d++));
      }
      for (ConvArg& a : op.args) {
        if (a.reordered && !a.output) {
          a.reorder.execute(stream_, a.user, a.inner);
        }
      }
      op.primitive.execute(stream_, op.exec_args);
      for (ConvArg& a : op.args) {
        if (a.reordered && a.output) {
          a.reorder.execute(stream_, a.inner, a.user);
        }
      }
    });
  }

  // An operation on arguments {arg, output, user (plain) desc, the
  // primitive's desc}.
  struct ArgSpec {
    int arg;
    bool output;
    memory::desc user;
    memory::desc inner;
  };
  ConvOp MakeOp(dnnl::primitive primitive, const std::vector<ArgSpec>& specs) {
    ConvOp op;
    op.primitive = std::move(primitive);
    for (const ArgSpec& spec : specs) {
      ConvArg a;
      a.arg = spec.arg;
      a.output = spec.output;
      a.user = memory(spec.user, engine_, DNNL_MEMORY_NONE);
      if (spec.inner == spec.user) {
        a.inner = a.user;
      } else {
        a.reordered = true;
        a.inner = memory(spec.inner, engine_);
        a.reorder = spec.output ? dnnl::reorder(a.inner, a.user)
                                : dnnl::reorder(a.user, a.inner);
      }
      op.exec_args.emplace(a.arg, a.inner);
      op.args.push_back(std::move(a));
    }
    return op;
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

  // The cached primitives of `g` (a checked geometry with n > 0), made on
  // first use.
  absl::StatusOr<ConvPrimitives*> Conv(const ConvGeometry& g) {
    auto it = conv_cache_.find(KeyOf(g));
    if (it != conv_cache_.end()) return it->second.get();
    try {
      const memory::dims src_dims = {g.n, g.in_channels, g.height, g.width};
      const memory::dims weight_dims = {g.out_channels, g.in_channels,
                                        g.kernel, g.kernel};
      const memory::dims dst_dims = {g.n, g.out_channels, g.out_height(),
                                     g.out_width()};
      const memory::desc src(src_dims, Dt::f32, Tag::nchw);
      const memory::desc weights(weight_dims, Dt::f32, Tag::oihw);
      const memory::desc dst(dst_dims, Dt::f32, Tag::nchw);
      const memory::desc any_src(src_dims, Dt::f32, Tag::any);
      const memory::desc any_weights(weight_dims, Dt::f32, Tag::any);
      const memory::desc any_dst(dst_dims, Dt::f32, Tag::any);
      const memory::dims strides = {g.stride, g.stride};
      const memory::dims pad = {g.pad, g.pad};
      // The right/bottom padding that makes oneDNN's output size ours.
      const memory::dims pad_r = {
          (g.out_height() - 1) * g.stride + g.kernel - g.height - g.pad,
          (g.out_width() - 1) * g.stride + g.kernel - g.width - g.pad};
      using Fwd = dnnl::convolution_forward;
      using BwdData = dnnl::convolution_backward_data;
      using BwdWeights = dnnl::convolution_backward_weights;
      const auto direct = dnnl::algorithm::convolution_direct;
      // Plain and blocked variants of each operation; each operation takes
      // the blocked one when PreferBlocked says so and it is a direct kernel.
      const Fwd::primitive_desc fwd_plain(
          Fwd::desc(dnnl::prop_kind::forward_training, direct, src, weights,
                    dst, strides, pad, pad_r),
          engine_);
      const Fwd::primitive_desc fwd_blocked(
          Fwd::desc(dnnl::prop_kind::forward_training, direct, any_src,
                    any_weights, any_dst, strides, pad, pad_r),
          engine_);
      const bool fwd_direct = IsDirectJit(fwd_blocked.impl_info_str());
      auto p = std::make_unique<ConvPrimitives>();

      const Fwd::primitive_desc& fwd =
          fwd_direct && PreferBlocked(ConvOpKind::kForward, g) ? fwd_blocked
                                                               : fwd_plain;
      p->forward =
          MakeOp(Fwd(fwd), {{DNNL_ARG_SRC, false, src, fwd.src_desc()},
                            {DNNL_ARG_WEIGHTS, false, weights,
                             fwd.weights_desc()},
                            {DNNL_ARG_DST, true, dst, fwd.dst_desc()}});

      const BwdData::primitive_desc data_plain(
          BwdData::desc(direct, src, weights, dst, strides, pad, pad_r),
          engine_, fwd_plain);
      const BwdData::primitive_desc data_blocked(
          BwdData::desc(direct, any_src, any_weights, any_dst, strides, pad,
                        pad_r),
          engine_, fwd_blocked);
      const BwdData::primitive_desc& data =
          fwd_direct && IsDirectJit(data_blocked.impl_info_str()) &&
                  PreferBlocked(ConvOpKind::kBackwardData, g)
              ? data_blocked
              : data_plain;
      p->backward_data = MakeOp(
          BwdData(data),
          {{DNNL_ARG_DIFF_DST, false, dst, data.diff_dst_desc()},
           {DNNL_ARG_WEIGHTS, false, weights, data.weights_desc()},
           {DNNL_ARG_DIFF_SRC, true, src, data.diff_src_desc()}});

      const BwdWeights::primitive_desc weights_plain(
          BwdWeights::desc(direct, src, weights, dst, strides, pad, pad_r),
          engine_, fwd_plain);
      const BwdWeights::primitive_desc weights_blocked(
          BwdWeights::desc(direct, any_src, any_weights, any_dst, strides, pad,
                           pad_r),
          engine_, fwd_blocked);
      const BwdWeights::primitive_desc& wgt =
          fwd_direct && IsDirectJit(weights_blocked.impl_info_str()) &&
                  PreferBlocked(ConvOpKind::kBackwardWeights, g)
              ? weights_blocked
              : weights_plain;
      p->backward_weights = MakeOp(
          BwdWeights(wgt),
          {{DNNL_ARG_SRC, false, src, wgt.src_desc()},
           {DNNL_ARG_DIFF_DST, false, dst, wgt.diff_dst_desc()},
           {DNNL_ARG_DIFF_WEIGHTS, true, weights, wgt.diff_weights_desc()}});

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
