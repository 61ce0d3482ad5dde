// Times the CUDA BN kernels on two layer shapes and compares them with a
// device-to-device copy of the same traffic and with cuDNN's batch norm.
//
// "us" is the device time of the kernels alone: cudaEvents around a batch of
// kBatch back-to-back launches on one stream, median of kReps batches after a
// warm-up, calling the launchers of bn/cuda_kernels_internal.h directly.
// "api us" is the wall time of the same step through BnKernels, which adds the
// per-channel parameter upload, the result download and a stream
// synchronization per call. Ratios are other_time / our_time, so above 1 means
// we are faster. "vs copy" compares with a cudaMemcpyAsync that moves the same
// bytes (reads half of them, writes the other half). "vs cuDNN" compares with
// cudnnBatchNormalizationForwardTraining / Backward (spatial mode, float NCHW).
//
// Without a CUDA device it prints "no CUDA device: <why>; skipping" and exits
// with status 0.

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bn/cuda_kernels.h"
#include "bn/cuda_kernels_internal.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "bn/shape.h"

namespace bnps::bn {
namespace {

namespace ci = cuda_internal;

constexpr int kWarmup = 5;
constexpr int kReps = 50;
constexpr int kBatch = 10;  // launches per timed rep
constexpr double kEps = 1e-5;

absl::Status Cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

absl::Status Cudnn(cudnnStatus_t st, const char* what) {
  if (st == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudnnGetErrorString(st)));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median device time in microseconds of one `enqueue` (which enqueues work on
// `stream` and returns at once).
absl::StatusOr<double> TimeDevice(
    cudaStream_t stream, const std::function<absl::Status()>& enqueue) {
  cudaEvent_t start = nullptr, stop = nullptr;
  if (auto s = Cuda(cudaEventCreate(&start), "cudaEventCreate"); !s.ok()) {
    return s;
  }
  auto destroy_start = absl::MakeCleanup([&] { cudaEventDestroy(start); });
  if (auto s = Cuda(cudaEventCreate(&stop), "cudaEventCreate"); !s.ok()) {
    return s;
  }
  auto destroy_stop = absl::MakeCleanup([&] { cudaEventDestroy(stop); });
  for (int i = 0; i < kWarmup; ++i) {
    if (auto s = enqueue(); !s.ok()) return s;
  }
  if (auto s = Cuda(cudaStreamSynchronize(stream), "warm-up"); !s.ok()) {
    return s;
  }
  std::vector<double> us;
  for (int rep = 0; rep < kReps; ++rep) {
    if (auto s = Cuda(cudaEventRecord(start, stream), "cudaEventRecord");
        !s.ok()) {
      return s;
    }
    for (int i = 0; i < kBatch; ++i) {
      if (auto s = enqueue(); !s.ok()) return s;
    }
    if (auto s = Cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
        !s.ok()) {
      return s;
    }
    if (auto s = Cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
        !s.ok()) {
      return s;
    }
    float ms = 0;
    if (auto s = Cuda(cudaEventElapsedTime(&ms, start, stop),
                      "cudaEventElapsedTime");
        !s.ok()) {
      return s;
    }
    us.push_back(1e3 * ms / kBatch);
  }
  return Median(std::move(us));
}

// Median wall time in microseconds of `call`, which returns when it is done.
absl::StatusOr<double> TimeHost(const std::function<absl::Status()>& call) {
  for (int i = 0; i < kWarmup; ++i) {
    if (auto s = call(); !s.ok()) return s;
  }
  std::vector<double> us;
  for (int rep = 0; rep < kReps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    if (auto s = call(); !s.ok()) return s;
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return Median(std::move(us));
}

// A device copy of `host`.
template <typename T>
absl::StatusOr<DeviceBuffer> Uploaded(const std::vector<T>& host) {
  absl::StatusOr<DeviceBuffer> b =
      DeviceBuffer::Create(0, host.size() * sizeof(T));
  if (!b.ok()) return b.status();
  if (auto s = b->CopyFromHost(host.data(), b->size()); !s.ok()) return s;
  return b;
}

// A cuDNN 4-d float NCHW descriptor.
struct TensorDesc {
  cudnnTensorDescriptor_t desc = nullptr;
  ~TensorDesc() {
    if (desc != nullptr) cudnnDestroyTensorDescriptor(desc);
  }
};

struct Row {
  std::string kernel;
  double bytes;
  double us;
  double api_us;
  double cudnn_us;  // 0: no cuDNN counterpart
};

absl::Status BenchmarkShape(const Shape& shape, cudaStream_t stream,
                            cudnnHandle_t cudnn, BnKernels* api,
                            std::vector<Row>* rows) {
  const int64_t e = shape.Elements();
  const int64_t c = shape.c;
  const ci::Dims dims{shape.n, shape.c, shape.Spatial()};

  // Inputs and outputs.
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.5f, 2.0f);
  std::vector<float> xh(e), dyh(e);
  for (float& v : xh) v = normal(rng);
  for (float& v : dyh) v = normal(rng);
  absl::StatusOr<DeviceBuffer> x = Uploaded(xh), dy = Uploaded(dyh);
  absl::StatusOr<DeviceBuffer> y = Uploaded(std::vector<float>(e)),
                               dx = Uploaded(std::vector<float>(e));
  if (!x.ok()) return x.status();
  if (!dy.ok()) return dy.status();
  if (!y.ok()) return y.status();
  if (!dx.ok()) return dx.status();

  // Statistics and per-channel parameters (as bn/cuda_kernels.cc computes
  // them).
  absl::StatusOr<Moments> m = api->ComputeMoments(x->floats(), shape);
  if (!m.ok()) return m.status();
  const std::vector<double> var = BiasedVariance(*m);
  const std::vector<float> gamma(c, 1.25f), beta(c, -0.5f);
  const Normalization norm{m->mean, var, gamma, beta, kEps};
  absl::StatusOr<BackwardSums> sums =
      api->BackwardReduce(dy->floats(), x->floats(), shape, norm);
  if (!sums.ok()) return sums.status();
  std::vector<ci::NormalizeParams> np(c);
  std::vector<ci::SplitMean> sm(c);
  std::vector<ci::BackwardInputParams> bp(c);
  const double inv_n = 1.0 / static_cast<double>(shape.PerChannel());
  for (int64_t i = 0; i < c; ++i) {
    const float hi = static_cast<float>(m->mean[i]);
    const float lo = static_cast<float>(m->mean[i] - hi);
    const double inv = 1.0 / std::sqrt(var[i] + kEps);
    const double gi = gamma[i] * inv;
    sm[i] = {hi, lo};
    np[i] = {hi, lo, static_cast<float>(gi), beta[i]};
    bp[i] = {hi, lo, static_cast<float>(gi),
             static_cast<float>(-gi * inv * sums->sum_dy_xhat[i] * inv_n),
             static_cast<float>(-gi * sums->sum_dy[i] * inv_n)};
  }
  absl::StatusOr<DeviceBuffer> np_d = Uploaded(np), sm_d = Uploaded(sm),
                               bp_d = Uploaded(bp);
  if (!np_d.ok()) return np_d.status();
  if (!sm_d.ok()) return sm_d.status();
  if (!bp_d.ok()) return bp_d.status();
  const size_t splits = static_cast<size_t>(ci::ReductionSplits(dims));
  absl::StatusOr<DeviceBuffer> partials =
      DeviceBuffer::Create(0, c * splits * sizeof(ci::MomentsPartial));
  absl::StatusOr<DeviceBuffer> results =
      DeviceBuffer::Create(0, c * sizeof(ci::MomentsPartial));
  if (!partials.ok()) return partials.status();
  if (!results.ok()) return results.status();

  const float* xp = x->floats();
  const float* dyp = dy->floats();
  float* yp = y->floats();
  float* dxp = dx->floats();
  auto moments = [&] {
    return Cuda(
        ci::LaunchMoments(
            xp, dims, static_cast<ci::MomentsPartial*>(partials->data()),
            static_cast<ci::MomentsPartial*>(results->data()), stream),
        "LaunchMoments");
  };
  auto normalize = [&] {
    return Cuda(
        ci::LaunchNormalize(
            xp, dims, static_cast<const ci::NormalizeParams*>(np_d->data()), yp,
            stream),
        "LaunchNormalize");
  };
  auto backward_reduce = [&] {
    return Cuda(
        ci::LaunchBackwardReduce(
            dyp, xp, dims, static_cast<const ci::SplitMean*>(sm_d->data()),
            static_cast<ci::SumsPartial*>(partials->data()),
            static_cast<ci::SumsPartial*>(results->data()), stream),
        "LaunchBackwardReduce");
  };
  auto backward_input = [&] {
    return Cuda(ci::LaunchBackwardInput(
                    dyp, xp, dims,
                    static_cast<const ci::BackwardInputParams*>(bp_d->data()),
                    dxp, stream),
                "LaunchBackwardInput");
  };

  // The same steps through the public API (each call synchronizes).
  auto api_moments = [&] { return api->ComputeMoments(xp, shape).status(); };
  auto api_normalize = [&] { return api->Normalize(xp, shape, norm, yp); };
  auto api_backward_reduce = [&] {
    return api->BackwardReduce(dyp, xp, shape, norm).status();
  };
  auto api_backward_input = [&] {
    return api->BackwardInput(dyp, xp, shape, norm, *sums, shape.PerChannel(),
                              dxp);
  };
  auto api_forward = [&]() -> absl::Status {
    absl::StatusOr<Moments> mm = api->ComputeMoments(xp, shape);
    if (!mm.ok()) return mm.status();
    const std::vector<double> v = BiasedVariance(*mm);
    return api->Normalize(xp, shape,
                          Normalization{mm->mean, v, gamma, beta, kEps}, yp);
  };
  auto api_backward = [&]() -> absl::Status {
    absl::StatusOr<BackwardSums> s = api->BackwardReduce(dyp, xp, shape, norm);
    if (!s.ok()) return s.status();
    return api->BackwardInput(dyp, xp, shape, norm, *s, shape.PerChannel(),
                              dxp);
  };

  // cuDNN.
  TensorDesc x_desc, bn_desc;
  if (auto s = Cudnn(cudnnCreateTensorDescriptor(&x_desc.desc), "create desc");
      !s.ok()) {
    return s;
  }
  if (auto s = Cudnn(cudnnSetTensor4dDescriptor(
                         x_desc.desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                         static_cast<int>(shape.n), static_cast<int>(shape.c),
                         static_cast<int>(shape.h), static_cast<int>(shape.w)),
                     "cudnnSetTensor4dDescriptor");
      !s.ok()) {
    return s;
  }
  if (auto s = Cudnn(cudnnCreateTensorDescriptor(&bn_desc.desc), "create desc");
      !s.ok()) {
    return s;
  }
  if (auto s = Cudnn(cudnnDeriveBNTensorDescriptor(bn_desc.desc, x_desc.desc,
                                                   CUDNN_BATCHNORM_SPATIAL),
                     "cudnnDeriveBNTensorDescriptor");
      !s.ok()) {
    return s;
  }
  // scale, bias, running mean, running var, saved mean, saved inv var, dscale,
  // dbias.
  std::vector<DeviceBuffer> per_channel;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<DeviceBuffer> b =
        Uploaded(std::vector<float>(c, i == 0 ? 1.25f : 0.0f));
    if (!b.ok()) return b.status();
    per_channel.push_back(*std::move(b));
  }
  const float one = 1.0f, zero = 0.0f;
  auto cudnn_forward = [&] {
    return Cudnn(cudnnBatchNormalizationForwardTraining(
                     cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x_desc.desc,
                     xp, x_desc.desc, yp, bn_desc.desc, per_channel[0].data(),
                     per_channel[1].data(), 0.1, per_channel[2].data(),
                     per_channel[3].data(), kEps, per_channel[4].data(),
                     per_channel[5].data()),
                 "cudnnBatchNormalizationForwardTraining");
  };
  auto cudnn_backward = [&] {
    return Cudnn(
        cudnnBatchNormalizationBackward(
            cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero,
            x_desc.desc, xp, x_desc.desc, dyp, x_desc.desc, dxp, bn_desc.desc,
            per_channel[0].data(), per_channel[6].data(), per_channel[7].data(),
            kEps, per_channel[4].data(), per_channel[5].data()),
        "cudnnBatchNormalizationBackward");
  };
  // Fill the saved mean / inv var the backward pass reads.
  if (auto s = cudnn_forward(); !s.ok()) return s;

  struct Step {
    const char* name;
    double bytes;
    std::function<absl::Status()> device, host, cudnn;
  };
  const double f = 4.0 * static_cast<double>(e);  // bytes of one tensor
  const std::vector<Step> steps = {
      {"moments", 1 * f, moments, api_moments, nullptr},
      {"normalize", 2 * f, normalize, api_normalize, nullptr},
      {"backward reduce", 2 * f, backward_reduce, api_backward_reduce, nullptr},
      {"backward input", 3 * f, backward_input, api_backward_input, nullptr},
      {"forward training", 3 * f,
       [&]() -> absl::Status {
         if (auto s = moments(); !s.ok()) return s;
         return normalize();
       },
       api_forward, cudnn_forward},
      {"backward", 5 * f,
       [&]() -> absl::Status {
         if (auto s = backward_reduce(); !s.ok()) return s;
         return backward_input();
       },
       api_backward, cudnn_backward},
  };
  for (const Step& step : steps) {
    absl::StatusOr<double> us = TimeDevice(stream, step.device);
    if (!us.ok()) return us.status();
    absl::StatusOr<double> api_us = TimeHost(step.host);
    if (!api_us.ok()) return api_us.status();
    double cudnn_us = 0;
    if (step.cudnn) {
      absl::StatusOr<double> t = TimeDevice(stream, step.cudnn);
      if (!t.ok()) return t.status();
      cudnn_us = *t;
    }
    rows->push_back({step.name, step.bytes, *us, *api_us, cudnn_us});
  }
  return absl::OkStatus();
}

// Median time of a device-to-device copy moving `bytes` in total.
absl::StatusOr<double> CopyTime(double bytes, cudaStream_t stream) {
  const size_t half = static_cast<size_t>(bytes / 2);
  absl::StatusOr<DeviceBuffer> src = DeviceBuffer::Create(0, half);
  absl::StatusOr<DeviceBuffer> dst = DeviceBuffer::Create(0, half);
  if (!src.ok()) return src.status();
  if (!dst.ok()) return dst.status();
  if (auto s = Cuda(cudaMemset(src->data(), 0, half), "cudaMemset"); !s.ok()) {
    return s;
  }
  return TimeDevice(stream, [&] {
    return Cuda(cudaMemcpyAsync(dst->data(), src->data(), half,
                                cudaMemcpyDeviceToDevice, stream),
                "cudaMemcpyAsync");
  });
}

absl::Status Run() {
  if (auto s = Cuda(cudaSetDevice(0), "cudaSetDevice"); !s.ok()) return s;
  cudaDeviceProp prop;
  if (auto s =
          Cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<BnKernels>> api = NewCudaBnKernels(0);
  if (!api.ok()) return api.status();
  cudaStream_t stream = nullptr;
  if (auto s = Cuda(cudaStreamCreate(&stream), "cudaStreamCreate"); !s.ok()) {
    return s;
  }
  auto destroy_stream = absl::MakeCleanup([&] { cudaStreamDestroy(stream); });
  cudnnHandle_t cudnn = nullptr;
  if (auto s = Cudnn(cudnnCreate(&cudnn), "cudnnCreate"); !s.ok()) return s;
  auto destroy_cudnn = absl::MakeCleanup([&] { cudnnDestroy(cudnn); });
  if (auto s = Cudnn(cudnnSetStream(cudnn, stream), "cudnnSetStream");
      !s.ok()) {
    return s;
  }

  std::printf("%s, cuDNN %zu; median of %d batches of %d launches\n", prop.name,
              cudnnGetVersion(), kReps, kBatch);
  std::printf("%-17s %-18s %9s %10s %8s %8s %8s %9s\n", "kernel", "shape", "us",
              "MB moved", "GB/s", "vs copy", "vs cuDNN", "api us");
  for (const Shape& shape : {Shape{32, 64, 28, 28}, Shape{32, 256, 14, 14}}) {
    std::vector<Row> rows;
    if (auto s = BenchmarkShape(shape, stream, cudnn, api->get(), &rows);
        !s.ok()) {
      return s;
    }
    for (const Row& r : rows) {
      absl::StatusOr<double> copy_us = CopyTime(r.bytes, stream);
      if (!copy_us.ok()) return copy_us.status();
      const std::string cudnn_ratio =
          r.cudnn_us > 0 ? absl::StrFormat("%.2f", r.cudnn_us / r.us) : "-";
      std::printf("%-17s %-18s %9.1f %10.1f %8.0f %8.2f %8s %9.1f\n",
                  r.kernel.c_str(), shape.ToString().c_str(), r.us,
                  r.bytes / 1e6, r.bytes / (r.us * 1e3), *copy_us / r.us,
                  cudnn_ratio.c_str(), r.api_us);
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace bnps::bn

int main() {
  std::string why;
  if (bnps::bn::CudaDeviceCount(&why) == 0) {
    std::printf("no CUDA device: %s; skipping\n", why.c_str());
    return 0;
  }
  if (absl::Status s = bnps::bn::Run(); !s.ok()) {
    std::fprintf(stderr, "cuda_bn_benchmark: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
