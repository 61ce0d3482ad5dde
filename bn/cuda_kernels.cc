#include "bn/cuda_kernels.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bn/cuda_kernels_internal.h"
#include "bn/cuda_status.h"
#include "bn/staging_buffer.h"

namespace bnps::bn {
namespace {

using cuda_internal::BackwardInputParams;
using cuda_internal::Dims;
using cuda_internal::MomentsPartial;
using cuda_internal::NormalizeParams;
using cuda_internal::SplitMean;
using cuda_internal::SumsPartial;

Dims ToDims(const Shape& shape) { return {shape.n, shape.c, shape.Spatial()}; }

SplitMean Split(double mean) {
  const float hi = static_cast<float>(mean);
  return {hi, static_cast<float>(mean - static_cast<double>(hi))};
}

double InvStd(const Normalization& norm, size_t c) {
  return 1.0 / std::sqrt(norm.var[c] + norm.eps);
}

class CudaBnKernels final : public BnKernels {
 public:
  CudaBnKernels(int device, cudaStream_t stream)
      : device_(device), stream_(stream) {}

  ~CudaBnKernels() override {
    // Nothing is in flight (every method synchronizes); errors are ignored.
    cudaSetDevice(device_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return absl::StrCat("cuda:", device_); }

  absl::StatusOr<Moments> ComputeMoments(const float* x,
                                         const Shape& shape) override {
    if (absl::Status s = ValidateMomentsArgs(x, shape); !s.ok()) return s;
    Moments out = Moments::Empty(shape.c);
    if (shape.PerChannel() == 0) return out;
    const Dims dims = ToDims(shape);
    const size_t c = static_cast<size_t>(shape.c);
    const size_t splits =
        static_cast<size_t>(cuda_internal::ReductionSplits(dims));
    if (absl::Status s = Activate(); !s.ok()) return s;
    if (absl::Status s =
            Reserve(&partials_, c * splits * sizeof(MomentsPartial));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Reserve(&results_, c * sizeof(MomentsPartial));
        !s.ok()) {
      return s;
    }
    auto* results = static_cast<MomentsPartial*>(results_.data());
    MomentsPartial* host = nullptr;
    if (absl::Status s = to_host_.Reserve(c, &host); !s.ok()) return s;
    cudaError_t err = cuda_internal::LaunchMoments(
        x, dims, static_cast<MomentsPartial*>(partials_.data()), results,
        stream_);
    if (err == cudaSuccess) {
      err = cudaMemcpyAsync(host, results, c * sizeof(MomentsPartial),
                            cudaMemcpyDeviceToHost, stream_);
    }
    if (absl::Status s = Finish(err, "moments"); !s.ok()) return s;
    out.count = shape.PerChannel();
    for (size_t i = 0; i < c; ++i) {
      if (host[i].count != static_cast<double>(out.count)) {
        return absl::InternalError(
            absl::StrCat("moments kernel counted ", host[i].count,
                         " samples in channel ", i, ", expected ", out.count));
      }
      out.mean[i] = host[i].mean;
      out.m2[i] = host[i].m2;
    }
    return out;
  }

  absl::Status Normalize(const float* x, const Shape& shape,
                         const Normalization& norm, float* y) override {
    if (absl::Status s = ValidateNormalizeArgs(x, shape, norm, y); !s.ok()) return s;
    if (shape.Elements() == 0) return absl::OkStatus();
    const size_t c = static_cast<size_t>(shape.c);
    if (absl::Status s = Activate(); !s.ok()) return s;
    if (absl::Status s = Upload<NormalizeParams>(
            c,
            [&](NormalizeParams* params) {
              for (size_t i = 0; i < c; ++i) {
                const SplitMean m = Split(norm.mean[i]);
                params[i] = {m.hi, m.lo,
                             static_cast<float>(norm.gamma[i] * InvStd(norm, i)),
                             norm.beta[i]};
              }
            },
            &params_);
        !s.ok()) {
      return s;
    }
    const cudaError_t err = cuda_internal::LaunchNormalize(
        x, ToDims(shape), static_cast<const NormalizeParams*>(params_.data()),
        y, stream_);
    return Finish(err, "normalize");
  }

  absl::StatusOr<BackwardSums> BackwardReduce(
      const float* dy, const float* x, const Shape& shape,
      const Normalization& norm) override {
    if (absl::Status s = ValidateBackwardReduceArgs(dy, x, shape, norm); !s.ok()) return s;
    BackwardSums sums = BackwardSums::Zero(shape.c);
    if (shape.PerChannel() == 0) return sums;
    const Dims dims = ToDims(shape);
    const size_t c = static_cast<size_t>(shape.c);
    const size_t splits =
        static_cast<size_t>(cuda_internal::ReductionSplits(dims));
    if (absl::Status s = Activate(); !s.ok()) return s;
    if (absl::Status s = Upload<SplitMean>(
            c,
            [&](SplitMean* mean) {
              for (size_t i = 0; i < c; ++i) mean[i] = Split(norm.mean[i]);
            },
            &params_);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Reserve(&partials_, c * splits * sizeof(SumsPartial));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Reserve(&results_, c * sizeof(SumsPartial)); !s.ok()) {
      return s;
    }
    auto* results = static_cast<SumsPartial*>(results_.data());
    SumsPartial* host = nullptr;
    if (absl::Status s = to_host_.Reserve(c, &host); !s.ok()) return s;
    cudaError_t err = cuda_internal::LaunchBackwardReduce(
        dy, x, dims, static_cast<const SplitMean*>(params_.data()),
        static_cast<SumsPartial*>(partials_.data()), results, stream_);
    if (err == cudaSuccess) {
      err = cudaMemcpyAsync(host, results, c * sizeof(SumsPartial),
                            cudaMemcpyDeviceToHost, stream_);
    }
    if (absl::Status s = Finish(err, "backward reduce"); !s.ok()) return s;
    for (size_t i = 0; i < c; ++i) {
      sums.sum_dy[i] = host[i].sum_dy;
      sums.sum_dy_xhat[i] = host[i].sum_dy_d * InvStd(norm, i);
    }
    return sums;
  }

  absl::Status BackwardInput(const float* dy, const float* x,
                             const Shape& shape, const Normalization& norm,
                             const BackwardSums& sums, int64_t count,
                             float* dx) override {
    if (absl::Status s = ValidateBackwardInputArgs(dy, x, shape, norm, sums,
                                                   count, dx);
        !s.ok()) {
      return s;
    }
    if (shape.Elements() == 0) return absl::OkStatus();
    // dx = gamma*inv * (dy - sum_dy/n - x_hat * sum_dy_xhat/n), x_hat = d*inv.
    const size_t c = static_cast<size_t>(shape.c);
    const double inv_n = 1.0 / static_cast<double>(count);
    if (absl::Status s = Activate(); !s.ok()) return s;
    if (absl::Status s = Upload<BackwardInputParams>(
            c,
            [&](BackwardInputParams* params) {
              for (size_t i = 0; i < c; ++i) {
                const SplitMean m = Split(norm.mean[i]);
                const double inv = InvStd(norm, i);
                const double gi = norm.gamma[i] * inv;
                params[i] = {
                    m.hi, m.lo, static_cast<float>(gi),
                    static_cast<float>(-gi * inv * sums.sum_dy_xhat[i] * inv_n),
                    static_cast<float>(-gi * sums.sum_dy[i] * inv_n)};
              }
            },
            &params_);
        !s.ok()) {
      return s;
    }
    const cudaError_t err = cuda_internal::LaunchBackwardInput(
        dy, x, ToDims(shape),
        static_cast<const BackwardInputParams*>(params_.data()), dx, stream_);
    return Finish(err, "backward input");
  }

 private:
  absl::Status Activate() {
    return CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  }

  // Makes *buf hold at least `bytes` (nothing is in flight between calls).
  absl::Status Reserve(DeviceBuffer* buf, size_t bytes) {
    if (buf->size() >= bytes) return absl::OkStatus();
    *buf = DeviceBuffer();
    absl::StatusOr<DeviceBuffer> fresh = DeviceBuffer::Create(device_, bytes);
    if (!fresh.ok()) return fresh.status();
    *buf = *std::move(fresh);
    return absl::OkStatus();
  }

  // Has `fill` write `count` values of T into pinned memory and enqueues
  // their copy to *buf (asynchronous: the pinned buffer is not touched again
  // before Finish).
  template <typename T, typename Fill>
  absl::Status Upload(size_t count, Fill fill, DeviceBuffer* buf) {
    const size_t bytes = count * sizeof(T);
    if (absl::Status s = Reserve(buf, bytes); !s.ok()) return s;
    T* host = nullptr;
    if (absl::Status s = to_device_.Reserve(count, &host); !s.ok()) return s;
    fill(host);
    return CudaStatus(cudaMemcpyAsync(buf->data(), host, bytes,
                                      cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpyAsync to device");
  }

  // Waits for the stream, also after a failed enqueue (so nothing is left
  // reading the caller's buffers), and returns the first error.
  absl::Status Finish(cudaError_t err, absl::string_view what) {
    const cudaError_t sync = cudaStreamSynchronize(stream_);
    if (err != cudaSuccess) return CudaStatus(err, what);
    return CudaStatus(sync, what);
  }

  const int device_;
  const cudaStream_t stream_;
  DeviceBuffer params_;    // per-channel parameters, uploaded per call
  DeviceBuffer partials_;  // per-block partial results of the reductions
  DeviceBuffer results_;   // per-channel results of the reductions
  // Pinned host memory for the per-channel copies, both ways; grown, never
  // shrunk: after the first step an exchange allocates nothing.
  StagingBuffer to_device_{PinnedHostMemory()};
  StagingBuffer to_host_{PinnedHostMemory()};
};

}  // namespace

int CudaDeviceCount(std::string* why_none) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the error, it is reported here
    if (why_none != nullptr) *why_none = cudaGetErrorString(err);
    return 0;
  }
  if (count == 0 && why_none != nullptr) *why_none = "no CUDA devices found";
  return count;
}

absl::Status SelectCudaDevice(int device_ordinal) {
  std::string why;
  const int count = CudaDeviceCount(&why);
  if (count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device ", device_ordinal, ": ", why));
  }
  if (device_ordinal < 0 || device_ordinal >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device ", device_ordinal, ": there are ", count, " devices"));
  }
  if (absl::Status s =
          CudaStatus(cudaSetDevice(device_ordinal), "cudaSetDevice");
      !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BnKernels>> NewCudaBnKernels(
    int device_ordinal) {
  if (absl::Status s = SelectCudaDevice(device_ordinal); !s.ok()) return s;
  // A blocking stream: work the caller enqueued on the legacy default stream is
  // ordered before the kernels.
  cudaStream_t stream = nullptr;
  if (absl::Status s =
          CudaStatus(cudaStreamCreate(&stream), "cudaStreamCreate");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<BnKernels>(
      std::make_unique<CudaBnKernels>(device_ordinal, stream));
}

// ---- DeviceBuffer -----------------------------------------------------------

DeviceBuffer::~DeviceBuffer() { Free(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(other.device_),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Free();
    device_ = other.device_;
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void DeviceBuffer::Free() {
  if (data_ != nullptr)
    cudaFree(data_);  // errors ignored; memory of a dead context
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(int device_ordinal,
                                                  size_t bytes) {
  if (bytes == 0) return DeviceBuffer(device_ordinal, nullptr, 0);
  if (absl::Status s =
          CudaStatus(cudaSetDevice(device_ordinal), "cudaSetDevice");
      !s.ok()) {
    return s;
  }
  void* data = nullptr;
  if (absl::Status s =
          CudaStatus(cudaMalloc(&data, bytes),
                     absl::StrCat("cudaMalloc of ", bytes, " bytes"));
      !s.ok()) {
    return s;
  }
  return DeviceBuffer(device_ordinal, data, bytes);
}

absl::Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes) {
  if (bytes > size_ || (bytes > 0 && src == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy of ", bytes, " bytes into a device buffer of ", size_, " bytes"));
  }
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
      !s.ok()) {
    return s;
  }
  return CudaStatus(cudaMemcpy(data_, src, bytes, cudaMemcpyHostToDevice),
                    "cudaMemcpy to device");
}

absl::Status DeviceBuffer::CopyToHost(void* dst, size_t bytes) const {
  if (bytes > size_ || (bytes > 0 && dst == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy of ", bytes, " bytes out of a device buffer of ",
                     size_, " bytes"));
  }
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
      !s.ok()) {
    return s;
  }
  return CudaStatus(cudaMemcpy(dst, data_, bytes, cudaMemcpyDeviceToHost),
                    "cudaMemcpy to host");
}

}  // namespace bnps::bn
