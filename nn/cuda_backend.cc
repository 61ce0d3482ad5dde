#include "nn/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bn/cuda_kernels.h"
#include "bn/kernels.h"
#include "bn/staging_buffer.h"
#include "nn/backend.h"
#include "nn/cuda_backend_internal.h"
#include "nn/cuda_common.h"
#include "nn/cudnn_conv.h"

namespace bnps::nn {
namespace {

using cuda_internal::BackwardDataAlgorithm;
using cuda_internal::BackwardFilterAlgorithm;
using cuda_internal::CheckFitsCudnn;
using cuda_internal::Chosen;
using cuda_internal::ConvKey;
using cuda_internal::ConvPlan;
using cuda_internal::CublasHandle;
using cuda_internal::CublasStatus;
using cuda_internal::CudaStatus;
using cuda_internal::CudnnHandle;
using cuda_internal::CudnnStatus;
using cuda_internal::DeviceMemory;
using cuda_internal::ForwardAlgorithm;
using cuda_internal::KeyOf;
using cuda_internal::LogCudaError;
using cuda_internal::MakePlan;
using cuda_internal::Stream;

// Convolution plans kept before the cache starts over. A network has a handful
// of convolution geometries (each twice at most: full and last batch); the
// bound only guards against a caller that varies the batch every step.
constexpr size_t kMaxConvPlans = 64;

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

  // All copies queued into pinned memory, one wait, then out to the callers'
  // buffers (a model's gradients: one stream synchronization, not one each).
  absl::Status DoCopyManyToHost(absl::Span<const HostCopy> copies) override {
    int64_t total = 0;
    for (const HostCopy& c : copies) total += c.n;
    if (absl::Status s = Activate(); !s.ok()) return s;
    float* staged = nullptr;
    if (absl::Status s = download_.Reserve(static_cast<size_t>(total), &staged);
        !s.ok()) {
      return s;
    }
    absl::Status enqueued;
    int64_t at = 0;
    for (const HostCopy& c : copies) {
      enqueued = CudaStatus(
          cudaMemcpyAsync(staged + at, c.src,
                          static_cast<size_t>(c.n) * sizeof(float),
                          cudaMemcpyDeviceToHost, stream()),
          "CopyManyToHost: cudaMemcpyAsync");
      if (!enqueued.ok()) break;
      at += c.n;
    }
    if (absl::Status s = Finish(enqueued); !s.ok()) return s;
    at = 0;
    for (const HostCopy& c : copies) {
      std::memcpy(c.host, staged + at, static_cast<size_t>(c.n) * sizeof(float));
      at += c.n;
    }
    return absl::OkStatus();
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
        WithWorkspace(ForwardAlgorithm(cudnn_.get(), *plan, g));
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
        WithWorkspace(BackwardDataAlgorithm(cudnn_.get(), *plan, g));
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
        WithWorkspace(BackwardFilterAlgorithm(cudnn_.get(), *plan, g));
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

  // `chosen` (a plan's algorithm), once the scratch buffer holds its
  // workspace.
  template <typename Algo>
  absl::StatusOr<Chosen<Algo>> WithWorkspace(
      absl::StatusOr<Chosen<Algo>> chosen) {
    if (!chosen.ok()) return chosen;
    if (absl::Status s = ReserveScratch(chosen->workspace_bytes); !s.ok()) {
      return s;
    }
    return chosen;
  }

  const int device_;
  // Declared first, destroyed last: the handles below are bound to it.
  Stream stream_;
  CudnnHandle cudnn_;
  CublasHandle cublas_;
  std::unique_ptr<bn::BnKernels> bn_;
  std::map<ConvKey, ConvPlan> plans_;
  // Pinned host memory for CopyManyToHost; grown, never shrunk.
  bn::StagingBuffer download_{bn::PinnedHostMemory()};
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
