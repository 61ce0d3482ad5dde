#include "worker/nn/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bn/cuda_kernels.h"
#include "bn/kernels.h"
#include "worker/nn/backend.h"
#include "worker/nn/cuda_backend_internal.h"

namespace bnps::nn {
namespace {

// Convolution plans kept before the cache starts over. A network has a handful
// of convolution geometries (each twice at most: full and last batch); the
// bound only guards against a caller that varies the batch every step.
constexpr size_t kMaxConvPlans = 64;

// cuDNN's heuristics may rank first an algorithm that wants a huge workspace
// (FFT); such candidates are skipped in favour of the next deterministic one.
constexpr size_t kMaxPreferredWorkspaceBytes = size_t{512} << 20;

// ---- Errors -----------------------------------------------------------------

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  // Clear the thread's last error so a later launch check does not report it
  // again (sticky errors stay, and fail every later call anyway).
  (void)cudaGetLastError();
  std::string message = absl::StrCat(what, ": ", cudaGetErrorName(err), ": ",
                                     cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(std::move(message));
  }
  return absl::InternalError(std::move(message));
}

absl::Status CudnnStatus(cudnnStatus_t status, absl::string_view what) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  // cuDNN 9 keeps a more specific message per thread than the status string.
  char detail[512] = "";
  cudnnGetLastErrorString(detail, sizeof(detail));
  std::string message = absl::StrCat(what, ": ", cudnnGetErrorString(status));
  if (detail[0] != '\0') {
    absl::StrAppend(&message, " (last cuDNN message: ", detail, ")");
  }
  if (status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    return absl::ResourceExhaustedError(std::move(message));
  }
  return absl::InternalError(std::move(message));
}

absl::Status CublasStatus(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", cublasGetStatusName(status),
                                     ": ", cublasGetStatusString(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) {
    return absl::ResourceExhaustedError(std::move(message));
  }
  return absl::InternalError(std::move(message));
}

// Reads away cuDNN's message of a failure that is not an error here (an
// algorithm the workspace query rules out), so a later error does not show it.
void DropCudnnMessage() {
  char sink[512];
  cudnnGetLastErrorString(sink, sizeof(sink));
}

// Free must not fail (backend.h), so its errors only go to stderr.
void LogCudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  std::fprintf(stderr, "bnps cuda backend: %s: %s: %s\n", what,
               cudaGetErrorName(err), cudaGetErrorString(err));
}

// ---- Owned handles ----------------------------------------------------------

template <typename Handle, auto kDestroy>
struct HandleDeleter {
  void operator()(Handle handle) const { (void)kDestroy(handle); }
};

// A CUDA or library handle (a pointer type) destroyed with kDestroy.
template <typename Handle, auto kDestroy>
using Owned = std::unique_ptr<std::remove_pointer_t<Handle>,
                              HandleDeleter<Handle, kDestroy>>;

using Stream = Owned<cudaStream_t, &cudaStreamDestroy>;
using CudnnHandle = Owned<cudnnHandle_t, &cudnnDestroy>;
using CublasHandle = Owned<cublasHandle_t, &cublasDestroy>;
using TensorDesc =
    Owned<cudnnTensorDescriptor_t, &cudnnDestroyTensorDescriptor>;
using FilterDesc =
    Owned<cudnnFilterDescriptor_t, &cudnnDestroyFilterDescriptor>;
using ConvDesc =
    Owned<cudnnConvolutionDescriptor_t, &cudnnDestroyConvolutionDescriptor>;

struct DeviceFree {
  void operator()(void* p) const { LogCudaError(cudaFree(p), "cudaFree"); }
};
using DeviceMemory = std::unique_ptr<void, DeviceFree>;

// ---- Convolution plans ------------------------------------------------------

template <typename Algo>
struct Chosen {
  Algo algo;
  size_t workspace_bytes;
};

// Descriptors of one geometry and the algorithm chosen per direction (each on
// first use).
struct ConvPlan {
  TensorDesc x;
  TensorDesc y;
  FilterDesc w;
  ConvDesc conv;
  std::optional<Chosen<cudnnConvolutionFwdAlgo_t>> forward;
  std::optional<Chosen<cudnnConvolutionBwdDataAlgo_t>> backward_data;
  std::optional<Chosen<cudnnConvolutionBwdFilterAlgo_t>> backward_filter;
};

using ConvKey = std::array<int64_t, 8>;

ConvKey KeyOf(const ConvGeometry& g) {
  return {g.n,      g.in_channels, g.height, g.width, g.out_channels,
          g.kernel, g.stride,      g.pad};
}

std::string Describe(const ConvGeometry& g) {
  return absl::StrCat("n=", g.n, " in_channels=", g.in_channels,
                      " height=", g.height, " width=", g.width,
                      " out_channels=", g.out_channels, " kernel=", g.kernel,
                      " stride=", g.stride, " pad=", g.pad);
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

// ---- The backend ------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, Stream stream, CudnnHandle cudnn, CublasHandle cublas,
              std::unique_ptr<bn::BnKernels> bn)
      : device_(device),
        stream_(std::move(stream)),
        cudnn_(std::move(cudnn)),
        cublas_(std::move(cublas)),
        bn_(std::move(bn)) {}

  ~CudaBackend() override {
    // Nothing is in flight (every call synchronizes); the members' destroy
    // calls need this device current.
    LogCudaError(cudaSetDevice(device_), "cudaSetDevice");
  }

  std::string name() const override { return absl::StrCat("cuda:", device_); }

  bn::BnKernels& bn() override { return *bn_; }

 protected:
  void Free(float* data) override {
    if (data == nullptr) return;
    LogCudaError(cudaSetDevice(device_), "cudaSetDevice");
    LogCudaError(cudaFree(data), "cudaFree");
  }

 private:
  // The arguments were checked by Backend (backend.h); n > 0 throughout.

  absl::StatusOr<Buffer> DoAllocate(int64_t n) override {
    // Backend::Allocate has ruled out byte counts beyond int64_t.
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    if (absl::Status s = Activate(); !s.ok()) return s;
    void* raw = nullptr;
    if (absl::Status s =
            CudaStatus(cudaMalloc(&raw, bytes),
                       absl::StrCat("cudaMalloc of ", bytes, " bytes"));
        !s.ok()) {
      return s;
    }
    DeviceMemory memory(raw);
    if (absl::Status s = Finish(CudaStatus(
            cudaMemsetAsync(raw, 0, bytes, stream()), "cudaMemsetAsync"));
        !s.ok()) {
      return s;
    }
    return Buffer(this, static_cast<float*>(memory.release()), n);
  }

  absl::Status DoCopyToDevice(const float* host, int64_t n,
                              float* dst) override {
    return Copy(host, n, dst, cudaMemcpyHostToDevice, "CopyToDevice");
  }

  absl::Status DoCopyToHost(const float* src, int64_t n, float* host) override {
    return Copy(src, n, host, cudaMemcpyDeviceToHost, "CopyToHost");
  }

  absl::Status DoZero(float* dst, int64_t n) override {
    if (absl::Status s = Activate(); !s.ok()) return s;
    return Finish(CudaStatus(
        cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * sizeof(float),
                        stream()),
        "cudaMemsetAsync"));
  }

  absl::Status DoConvForward(const ConvGeometry& g, const float* x,
                             const float* w, float* y) override {
    if (absl::Status s = CheckFitsCudnn(g); !s.ok()) return s;
    absl::StatusOr<ConvPlan*> plan = PlanFor(g);
    if (!plan.ok()) return plan.status();
    absl::StatusOr<Chosen<cudnnConvolutionFwdAlgo_t>> algo =
        Choose<ForwardDirection>(**plan, g);
    if (!algo.ok()) return algo.status();
    const ConvPlan& p = **plan;
    const float one = 1.0f;
    const float zero = 0.0f;
    return Finish(CudnnStatus(
        cudnnConvolutionForward(cudnn_.get(), &one, p.x.get(), x, p.w.get(), w,
                                p.conv.get(), algo->algo, scratch_.get(),
                                algo->workspace_bytes, &zero, p.y.get(), y),
        "cudnnConvolutionForward"));
  }

  absl::Status DoConvBackwardData(const ConvGeometry& g, const float* dy,
                                  const float* w, float* dx) override {
    if (absl::Status s = CheckFitsCudnn(g); !s.ok()) return s;
    absl::StatusOr<ConvPlan*> plan = PlanFor(g);
    if (!plan.ok()) return plan.status();
    absl::StatusOr<Chosen<cudnnConvolutionBwdDataAlgo_t>> algo =
        Choose<BackwardDataDirection>(**plan, g);
    if (!algo.ok()) return algo.status();
    const ConvPlan& p = **plan;
    const float one = 1.0f;
    const float zero = 0.0f;
    return Finish(CudnnStatus(cudnnConvolutionBackwardData(
                                  cudnn_.get(), &one, p.w.get(), w, p.y.get(),
                                  dy, p.conv.get(), algo->algo, scratch_.get(),
                                  algo->workspace_bytes, &zero, p.x.get(), dx),
                              "cudnnConvolutionBackwardData"));
  }

  absl::Status DoConvBackwardWeights(const ConvGeometry& g, const float* x,
                                     const float* dy, float* dw) override {
    if (absl::Status s = CheckFitsCudnn(g); !s.ok()) return s;
    absl::StatusOr<ConvPlan*> plan = PlanFor(g);
    if (!plan.ok()) return plan.status();
    absl::StatusOr<Chosen<cudnnConvolutionBwdFilterAlgo_t>> algo =
        Choose<BackwardFilterDirection>(**plan, g);
    if (!algo.ok()) return algo.status();
    const ConvPlan& p = **plan;
    const float one = 1.0f;
    const float zero = 0.0f;
    return Finish(CudnnStatus(cudnnConvolutionBackwardFilter(
                                  cudnn_.get(), &one, p.x.get(), x, p.y.get(),
                                  dy, p.conv.get(), algo->algo, scratch_.get(),
                                  algo->workspace_bytes, &zero, p.w.get(), dw),
                              "cudnnConvolutionBackwardFilter"));
  }

  // cuBLAS is column-major: a row-major r x c matrix is, to cuBLAS, the c x r
  // column-major matrix (its transpose) with leading dimension c. So with
  // X = x^T [in, n], W = w^T [in, out], DY = dy^T [out, n] as cuBLAS sees them:
  //   y^T  = W^T X    gemm(T, N, m=out, n=n,   k=in)
  //   dx^T = W DY     gemm(N, N, m=in,  n=n,   k=out)
  //   dw^T = X DY^T   gemm(N, T, m=in,  n=out, k=n)
  absl::Status DoLinearForward(const LinearGeometry& g, const float* x,
                               const float* w, const float* b,
                               float* y) override {
    if (absl::Status s = Activate(); !s.ok()) return s;
    // y = b in every row, then y += x w^T (beta = 1).
    absl::Status s = CudaStatus(
        cuda_internal::LaunchBroadcastRows(b, g.n, g.out, y, stream()),
        "bias broadcast kernel");
    if (s.ok()) {
      const float one = 1.0f;
      s = CublasStatus(
          cublasSgemm_64(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, g.out, g.n,
                         g.in, &one, w, g.in, x, g.in, &one, y, g.out),
          "cublasSgemm (linear forward)");
    }
    return Finish(std::move(s));
  }

  absl::Status DoLinearBackward(const LinearGeometry& g, const float* dy,
                                const float* x, const float* w, float* dx,
                                float* dw, float* db) override {
    if (absl::Status s = Activate(); !s.ok()) return s;
    const float one = 1.0f;
    const float zero = 0.0f;
    absl::Status s;
    if (dx != nullptr) {
      s = CublasStatus(
          cublasSgemm_64(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, g.in, g.n,
                         g.out, &one, w, g.in, dy, g.out, &zero, dx, g.in),
          "cublasSgemm (linear dx)");
    }
    if (s.ok()) {
      s = CublasStatus(
          cublasSgemm_64(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, g.in, g.out,
                         g.n, &one, x, g.in, dy, g.out, &zero, dw, g.in),
          "cublasSgemm (linear dw)");
    }
    if (s.ok()) {
      s = CudaStatus(
          cuda_internal::LaunchColumnSums(dy, g.n, g.out, db, stream()),
          "column sums kernel");
    }
    return Finish(std::move(s));
  }

  absl::Status DoReluForward(int64_t n, const float* x, float* y) override {
    if (absl::Status s = Activate(); !s.ok()) return s;
    return Finish(CudaStatus(
        cuda_internal::LaunchReluForward(n, x, y, stream()), "relu kernel"));
  }

  absl::Status DoReluBackward(int64_t n, const float* dy, const float* y,
                              float* dx) override {
    if (absl::Status s = Activate(); !s.ok()) return s;
    return Finish(
        CudaStatus(cuda_internal::LaunchReluBackward(n, dy, y, dx, stream()),
                   "relu backward kernel"));
  }

  absl::Status DoMaxPoolForward(const PoolGeometry& g, const float* x,
                                float* y) override {
    if (absl::Status s = Activate(); !s.ok()) return s;
    return Finish(CudaStatus(
        cuda_internal::LaunchMaxPoolForward(PoolDimsOf(g), x, y, stream()),
        "max pool kernel"));
  }

  absl::Status DoMaxPoolBackward(const PoolGeometry& g, const float* x,
                                 const float* dy, float* dx) override {
    if (absl::Status s = Activate(); !s.ok()) return s;
    const cuda_internal::PoolDims dims = PoolDimsOf(g);
    if (absl::Status s = ReserveScratch(static_cast<size_t>(
            cuda_internal::MaxPoolBackwardScratchBytes(dims)));
        !s.ok()) {
      return s;
    }
    return Finish(CudaStatus(cuda_internal::LaunchMaxPoolBackward(
                                 dims, x, dy, scratch_.get(), dx, stream()),
                             "max pool backward kernels"));
  }

  absl::Status DoGlobalAvgPoolForward(int64_t n, int64_t c, int64_t hw,
                                      const float* x, float* y) override {
    if (absl::Status s = Activate(); !s.ok()) return s;
    return Finish(CudaStatus(
        cuda_internal::LaunchGlobalAvgPoolForward(n * c, hw, x, y, stream()),
        "global average pool kernel"));
  }

  absl::Status DoGlobalAvgPoolBackward(int64_t n, int64_t c, int64_t hw,
                                       const float* dy, float* dx) override {
    if (absl::Status s = Activate(); !s.ok()) return s;
    return Finish(CudaStatus(
        cuda_internal::LaunchGlobalAvgPoolBackward(n * c, hw, dy, dx, stream()),
        "global average pool backward kernel"));
  }

  absl::Status DoAdd(int64_t n, const float* a, const float* b,
                     float* y) override {
    if (absl::Status s = Activate(); !s.ok()) return s;
    return Finish(CudaStatus(cuda_internal::LaunchAdd(n, a, b, y, stream()),
                             "add kernel"));
  }

  cudaStream_t stream() const { return stream_.get(); }

  // The calling thread's current device may be another backend's.
  absl::Status Activate() {
    return CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  }

  // Waits for the stream, also after a failed enqueue (so nothing still reads
  // or writes the caller's buffers), and returns the first error.
  absl::Status Finish(absl::Status enqueued) {
    const cudaError_t sync = cudaStreamSynchronize(stream());
    if (!enqueued.ok()) {
      if (sync != cudaSuccess) (void)cudaGetLastError();
      return enqueued;
    }
    return CudaStatus(sync, "cudaStreamSynchronize");
  }

  absl::Status Copy(const float* src, int64_t n, float* dst,
                    cudaMemcpyKind kind, const char* what) {
    if (absl::Status s = Activate(); !s.ok()) return s;
    return Finish(CudaStatus(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float), kind,
                        stream()),
        absl::StrCat(what, ": cudaMemcpyAsync")));
  }

  static cuda_internal::PoolDims PoolDimsOf(const PoolGeometry& g) {
    cuda_internal::PoolDims d;
    d.planes = g.n * g.channels;
    d.height = g.height;
    d.width = g.width;
    d.kernel = g.kernel;
    d.stride = g.stride;
    d.out_height = g.out_height();
    d.out_width = g.out_width();
    return d;
  }

  // Makes the scratch buffer hold at least `bytes` (nothing is in flight
  // between calls, so the old one can go first).
  absl::Status ReserveScratch(size_t bytes) {
    if (bytes <= scratch_bytes_) return absl::OkStatus();
    scratch_.reset();
    scratch_bytes_ = 0;
    void* raw = nullptr;
    if (absl::Status s = CudaStatus(
            cudaMalloc(&raw, bytes),
            absl::StrCat("cudaMalloc of ", bytes, " bytes of scratch"));
        !s.ok()) {
      return s;
    }
    scratch_.reset(raw);
    scratch_bytes_ = bytes;
    return absl::OkStatus();
  }

  // The cached plan of `g`, made on first use. Also makes the device current.
  absl::StatusOr<ConvPlan*> PlanFor(const ConvGeometry& g) {
    if (absl::Status s = Activate(); !s.ok()) return s;
    const ConvKey key = KeyOf(g);
    if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
    absl::StatusOr<ConvPlan> plan = MakePlan(g);
    if (!plan.ok()) return plan.status();
    if (plans_.size() >= kMaxConvPlans) plans_.clear();
    return &plans_.emplace(key, *std::move(plan)).first->second;
  }

  // The plan's algorithm for `Direction`, chosen on first use, with the
  // scratch buffer grown to its workspace.
  template <typename Direction>
  absl::StatusOr<Chosen<typename Direction::Algo>> Choose(
      ConvPlan& plan, const ConvGeometry& g) {
    auto* slot = Direction::Slot(&plan);
    if (!slot->has_value()) {
      absl::StatusOr<Chosen<typename Direction::Algo>> chosen =
          ChooseAlgorithm<Direction>(cudnn_.get(), plan, g);
      if (!chosen.ok()) return chosen.status();
      *slot = *chosen;
    }
    if (absl::Status s = ReserveScratch((*slot)->workspace_bytes); !s.ok()) {
      return s;
    }
    return **slot;
  }

  const int device_;
  // Declared first, destroyed last: the handles below are bound to it.
  Stream stream_;
  CudnnHandle cudnn_;
  CublasHandle cublas_;
  std::unique_ptr<bn::BnKernels> bn_;
  std::map<ConvKey, ConvPlan> plans_;
  // cuDNN workspace and max-pool argmax indices; grown, never shrunk.
  DeviceMemory scratch_;
  size_t scratch_bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device_ordinal) {
  if (absl::Status s = bn::SelectCudaDevice(device_ordinal); !s.ok()) {
    return s;
  }
  // A blocking stream, like the BN kernels': work the caller queued on the
  // legacy default stream is ordered before ours.
  cudaStream_t raw_stream = nullptr;
  if (absl::Status s =
          CudaStatus(cudaStreamCreate(&raw_stream), "cudaStreamCreate");
      !s.ok()) {
    return s;
  }
  Stream stream(raw_stream);

  cudnnHandle_t raw_cudnn = nullptr;
  if (absl::Status s = CudnnStatus(cudnnCreate(&raw_cudnn), "cudnnCreate");
      !s.ok()) {
    return s;
  }
  CudnnHandle cudnn(raw_cudnn);
  if (absl::Status s =
          CudnnStatus(cudnnSetStream(raw_cudnn, raw_stream), "cudnnSetStream");
      !s.ok()) {
    return s;
  }

  cublasHandle_t raw_cublas = nullptr;
  if (absl::Status s = CublasStatus(cublasCreate(&raw_cublas), "cublasCreate");
      !s.ok()) {
    return s;
  }
  CublasHandle cublas(raw_cublas);
  absl::Status s =
      CublasStatus(cublasSetStream(raw_cublas, raw_stream), "cublasSetStream");
  // Default math keeps FP32 GEMMs in FP32 (TF32 needs
  // CUBLAS_TF32_TENSOR_OP_MATH); no atomics keeps them deterministic.
  if (s.ok()) {
    s = CublasStatus(cublasSetMathMode(raw_cublas, CUBLAS_DEFAULT_MATH),
                     "cublasSetMathMode");
  }
  if (s.ok()) {
    s = CublasStatus(
        cublasSetAtomicsMode(raw_cublas, CUBLAS_ATOMICS_NOT_ALLOWED),
        "cublasSetAtomicsMode");
  }
  if (s.ok()) {
    s = CublasStatus(cublasSetPointerMode(raw_cublas, CUBLAS_POINTER_MODE_HOST),
                     "cublasSetPointerMode");
  }
  if (!s.ok()) return s;

  absl::StatusOr<std::unique_ptr<bn::BnKernels>> bn =
      bn::NewCudaBnKernels(device_ordinal);
  if (!bn.ok()) return bn.status();
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(
      device_ordinal, std::move(stream), std::move(cudnn), std::move(cublas),
      *std::move(bn)));
}

}  // namespace bnps::nn
