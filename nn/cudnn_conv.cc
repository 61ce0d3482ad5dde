#include "nn/cudnn_conv.h"

#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nn/backend.h"
#include "nn/cuda_common.h"

namespace bnps::nn::cuda_internal {
namespace {

// cuDNN's heuristics may rank first an algorithm that wants a huge workspace
// (FFT); such candidates are skipped in favour of the next deterministic one.
constexpr size_t kMaxPreferredWorkspaceBytes = size_t{512} << 20;

std::string Describe(const ConvGeometry& g) {
  return absl::StrCat("n=", g.n, " in_channels=", g.in_channels,
                      " height=", g.height, " width=", g.width,
                      " out_channels=", g.out_channels, " kernel=", g.kernel,
                      " stride=", g.stride, " pad=", g.pad);
}

// The three directions of a convolution, for ChooseAlgorithm. `Fallbacks` are
// deterministic algorithms that support every geometry here, tried when the
// heuristics offer nothing usable.
struct ForwardDirection {
  using Algo = cudnnConvolutionFwdAlgo_t;
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static constexpr const char* kName = "forward";
  static constexpr Algo kFallbacks[] = {
      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM};

  static cudnnStatus_t MaxCount(cudnnHandle_t h, int* count) {
    return cudnnGetConvolutionForwardAlgorithmMaxCount(h, count);
  }
  static cudnnStatus_t Heuristics(cudnnHandle_t h, const ConvPlan& p,
                                  int requested, int* returned, Perf* perf) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, p.x.get(), p.w.get(),
                                                  p.conv.get(), p.y.get(),
                                                  requested, returned, perf);
  }
  static cudnnStatus_t Workspace(cudnnHandle_t h, const ConvPlan& p, Algo algo,
                                 size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(
        h, p.x.get(), p.w.get(), p.conv.get(), p.y.get(), algo, bytes);
  }
  static std::optional<Chosen<Algo>>* Slot(ConvPlan* p) { return &p->forward; }
};

struct BackwardDataDirection {
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static constexpr const char* kName = "backward data";
  // ALGO_0 sums with atomics (non-deterministic); ALGO_1 does not.
  static constexpr Algo kFallbacks[] = {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1};

  static cudnnStatus_t MaxCount(cudnnHandle_t h, int* count) {
    return cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, count);
  }
  static cudnnStatus_t Heuristics(cudnnHandle_t h, const ConvPlan& p,
                                  int requested, int* returned, Perf* perf) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, p.w.get(), p.y.get(), p.conv.get(), p.x.get(), requested, returned,
        perf);
  }
  static cudnnStatus_t Workspace(cudnnHandle_t h, const ConvPlan& p, Algo algo,
                                 size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, p.w.get(), p.y.get(), p.conv.get(), p.x.get(), algo, bytes);
  }
  static std::optional<Chosen<Algo>>* Slot(ConvPlan* p) {
    return &p->backward_data;
  }
};

struct BackwardFilterDirection {
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static constexpr const char* kName = "backward filter";
  // ALGO_0 and ALGO_3 sum with atomics (non-deterministic); ALGO_1 does not.
  static constexpr Algo kFallbacks[] = {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1};

  static cudnnStatus_t MaxCount(cudnnHandle_t h, int* count) {
    return cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, count);
  }
  static cudnnStatus_t Heuristics(cudnnHandle_t h, const ConvPlan& p,
                                  int requested, int* returned, Perf* perf) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, p.x.get(), p.y.get(), p.conv.get(), p.w.get(), requested, returned,
        perf);
  }
  static cudnnStatus_t Workspace(cudnnHandle_t h, const ConvPlan& p, Algo algo,
                                 size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, p.x.get(), p.y.get(), p.conv.get(), p.w.get(), algo, bytes);
  }
  static std::optional<Chosen<Algo>>* Slot(ConvPlan* p) {
    return &p->backward_filter;
  }
};

// The first of cuDNN's heuristic candidates (best expected first) that is
// deterministic, needs no tensor cores and fits the workspace preference,
// else the first fallback cuDNN supports. Heuristics rather than cudnnFind*:
// timing-based choices can differ between runs and so change the rounding of
// results; heuristics are a pure function of geometry, GPU and cuDNN version.
template <typename Direction>
absl::StatusOr<Chosen<typename Direction::Algo>> ChooseAlgorithm(
    cudnnHandle_t handle, const ConvPlan& plan, const ConvGeometry& g) {
  using Algo = typename Direction::Algo;
  int max_count = 0;
  if (absl::Status s = CudnnStatus(Direction::MaxCount(handle, &max_count),
                                   "cudnnGetConvolution*AlgorithmMaxCount");
      !s.ok()) {
    return s;
  }
  std::vector<typename Direction::Perf> perf(
      static_cast<size_t>(max_count > 0 ? max_count : 1));
  int returned = 0;
  if (absl::Status s = CudnnStatus(
          Direction::Heuristics(handle, plan, static_cast<int>(perf.size()),
                                &returned, perf.data()),
          absl::StrCat("cudnnGetConvolution*Algorithm_v7 (", Direction::kName,
                       ")"));
      !s.ok()) {
    return s;
  }
  std::vector<Algo> preferred;
  for (int i = 0; i < returned && i < static_cast<int>(perf.size()); ++i) {
    const auto& p = perf[static_cast<size_t>(i)];
    if (p.status == CUDNN_STATUS_SUCCESS &&
        p.determinism == CUDNN_DETERMINISTIC &&
        p.mathType != CUDNN_TENSOR_OP_MATH &&
        p.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) {
      preferred.push_back(p.algo);
    }
  }
  // The workspace query runs with the plan's descriptors (FMA math); a
  // candidate it fails for is passed over.
  for (Algo algo : preferred) {
    size_t bytes = 0;
    if (Direction::Workspace(handle, plan, algo, &bytes) !=
        CUDNN_STATUS_SUCCESS) {
      DropCudnnMessage();
      continue;
    }
    if (bytes <= kMaxPreferredWorkspaceBytes) return Chosen<Algo>{algo, bytes};
  }
  for (Algo algo : Direction::kFallbacks) {
    size_t bytes = 0;
    if (Direction::Workspace(handle, plan, algo, &bytes) ==
        CUDNN_STATUS_SUCCESS) {
      return Chosen<Algo>{algo, bytes};
    }
    DropCudnnMessage();
  }
  return absl::InternalError(absl::StrCat("no deterministic cuDNN ",
                                          Direction::kName, " algorithm for ",
                                          Describe(g)));
}

// The plan's algorithm for `Direction`, chosen on first use.
template <typename Direction>
absl::StatusOr<Chosen<typename Direction::Algo>> Cached(cudnnHandle_t handle,
                                                        ConvPlan* plan,
                                                        const ConvGeometry& g) {
  auto* slot = Direction::Slot(plan);
  if (!slot->has_value()) {
    absl::StatusOr<Chosen<typename Direction::Algo>> chosen =
        ChooseAlgorithm<Direction>(handle, *plan, g);
    if (!chosen.ok()) return chosen.status();
    *slot = *chosen;
  }
  return **slot;
}

}  // namespace

ConvKey KeyOf(const ConvGeometry& g) {
  return {g.n,      g.in_channels, g.height, g.width, g.out_channels,
          g.kernel, g.stride,      g.pad};
}

// The legacy cuDNN API takes int dimensions.
absl::Status CheckFitsCudnn(const ConvGeometry& g) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  for (int64_t v : KeyOf(g)) {
    if (v > kMax) {
      return absl::InvalidArgumentError(absl::StrCat(
          "convolution geometry beyond cuDNN's int dimensions: ", Describe(g)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ConvPlan> MakePlan(const ConvGeometry& g) {
  const int n = static_cast<int>(g.n);
  const int c = static_cast<int>(g.in_channels);
  const int k = static_cast<int>(g.out_channels);
  const int kernel = static_cast<int>(g.kernel);
  const int stride = static_cast<int>(g.stride);
  const int pad = static_cast<int>(g.pad);
  ConvPlan plan;
  cudnnTensorDescriptor_t x = nullptr;
  cudnnTensorDescriptor_t y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  if (absl::Status s = CudnnStatus(cudnnCreateTensorDescriptor(&x),
                                   "cudnnCreateTensorDescriptor");
      !s.ok()) {
    return s;
  }
  plan.x.reset(x);
  if (absl::Status s = CudnnStatus(cudnnCreateTensorDescriptor(&y),
                                   "cudnnCreateTensorDescriptor");
      !s.ok()) {
    return s;
  }
  plan.y.reset(y);
  if (absl::Status s = CudnnStatus(cudnnCreateFilterDescriptor(&w),
                                   "cudnnCreateFilterDescriptor");
      !s.ok()) {
    return s;
  }
  plan.w.reset(w);
  if (absl::Status s = CudnnStatus(cudnnCreateConvolutionDescriptor(&conv),
                                   "cudnnCreateConvolutionDescriptor");
      !s.ok()) {
    return s;
  }
  plan.conv.reset(conv);

  absl::Status s =
      CudnnStatus(cudnnSetTensor4dDescriptor(
                      x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c,
                      static_cast<int>(g.height), static_cast<int>(g.width)),
                  "cudnnSetTensor4dDescriptor(x)");
  if (s.ok()) {
    s = CudnnStatus(
        cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k, c,
                                   kernel, kernel),
        "cudnnSetFilter4dDescriptor");
  }
  if (s.ok()) {
    // Cross-correlation (no kernel flip), as the CPU backend and every DL
    // framework define "convolution"; float accumulation.
    s = CudnnStatus(
        cudnnSetConvolution2dDescriptor(
            conv, pad, pad, stride, stride, /*dilation_h=*/1,
            /*dilation_w=*/1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        "cudnnSetConvolution2dDescriptor");
  }
  if (s.ok()) {
    // FMA math: plain FP32 kernels. CUDNN_DEFAULT_MATH would allow TF32
    // tensor cores on Ampere and later, ~1e-3 off the CPU reference.
    s = CudnnStatus(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH),
                    "cudnnSetConvolutionMathType");
  }
  int dims[4] = {0, 0, 0, 0};
  if (s.ok()) {
    s = CudnnStatus(cudnnGetConvolution2dForwardOutputDim(
                        conv, x, w, &dims[0], &dims[1], &dims[2], &dims[3]),
                    "cudnnGetConvolution2dForwardOutputDim");
  }
  if (!s.ok()) return s;
  if (dims[0] != g.n || dims[1] != g.out_channels ||
      dims[2] != g.out_height() || dims[3] != g.out_width()) {
    return absl::InternalError(absl::StrCat(
        "cuDNN output shape ", dims[0], "x", dims[1], "x", dims[2], "x",
        dims[3], " differs from the geometry's for ", Describe(g)));
  }
  if (absl::Status s2 = CudnnStatus(
          cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                     dims[0], dims[1], dims[2], dims[3]),
          "cudnnSetTensor4dDescriptor(y)");
      !s2.ok()) {
    return s2;
  }
  return plan;
}

absl::StatusOr<Chosen<cudnnConvolutionFwdAlgo_t>> ForwardAlgorithm(
    cudnnHandle_t handle, ConvPlan* plan, const ConvGeometry& g) {
  return Cached<ForwardDirection>(handle, plan, g);
}

absl::StatusOr<Chosen<cudnnConvolutionBwdDataAlgo_t>> BackwardDataAlgorithm(
    cudnnHandle_t handle, ConvPlan* plan, const ConvGeometry& g) {
  return Cached<BackwardDataDirection>(handle, plan, g);
}

absl::StatusOr<Chosen<cudnnConvolutionBwdFilterAlgo_t>> BackwardFilterAlgorithm(
    cudnnHandle_t handle, ConvPlan* plan, const ConvGeometry& g) {
  return Cached<BackwardFilterDirection>(handle, plan, g);
}

}  // namespace bnps::nn::cuda_internal
