// model_step_benchmark: the time of one training step (Forward + Loss +
// Backward + Gradients download) of the worker's model (nn/model.h) on
// the CPU backend or the CUDA backend, with local BN (nn::LocalBnExchange) and no
// parameter server. The PyTorch twin is bench/torch_model_step.py; the
// driver that runs both alternately and prints the comparison table is
// bench/model_step_compare.py.
//
// Output (stdout), machine-readable lines:
//   bnps_config device=cpu depth=1 width=16 batch=32 threads=1 weights=...
//   bnps_step_ms p50=<> mean=<> min=<>
//   bnps_phase_ms forward=<> loss=<> backward=<> gradients=<> total=<>
// The step line times whole steps (--iters of them after --warmup); the phase
// line comes from a second loop of --iters steps that times each phase
// separately (medians), so the phase numbers add up to about the step time.
//
// Run: bazel build -c opt //bench:model_step_benchmark &&
//      bazel-bin/bench/model_step_benchmark --batch=32 --threads=1
// Exit status: 0 on success, 2 for bad flags, 1 when a step fails.

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bn/cuda_kernels.h"
#include "nn/backend.h"
#include "nn/bn_exchange.h"
#include "nn/cpu_backend.h"
#include "nn/cuda_backend.h"
#include "nn/model.h"

ABSL_FLAG(int64_t, depth, 1, "residual blocks per stage");
ABSL_FLAG(int64_t, width, 16, "channels of the stem and stage 1");
ABSL_FLAG(int64_t, batch, 32, "images per step");
ABSL_FLAG(int, threads, 1, "OpenMP threads (omp_set_num_threads)");
ABSL_FLAG(std::string, device, "cpu", "cpu or gpu (CUDA device 0)");
ABSL_FLAG(int, warmup, 10, "untimed steps first");
ABSL_FLAG(int, iters, 50, "timed steps (and as many again for the phases)");
ABSL_FLAG(uint64_t, seed, 1, "seed of the parameters, images and labels");

namespace bnps::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  return std::accumulate(v.begin(), v.end(), 0.0) /
         static_cast<double>(v.size());
}

struct Phases {
  double forward = 0, loss = 0, backward = 0, gradients = 0;
};

class Bench {
 public:
  Bench(nn::Model* model, const std::vector<float>* images,
        const std::vector<int32_t>* labels, int64_t batch)
      : model_(model), images_(images), labels_(labels), batch_(batch) {}

  // One step; `phases` (optional) gets each phase's time.
  absl::Status Step(Phases* phases) {
    const Clock::time_point t0 = Clock::now();
    if (absl::Status s = model_->Forward(images_->data(), batch_); !s.ok()) {
      return s;
    }
    const Clock::time_point t1 = Clock::now();
    absl::StatusOr<nn::LossResult> loss = model_->Loss(labels_->data());
    if (!loss.ok()) return loss.status();
    const Clock::time_point t2 = Clock::now();
    if (absl::Status s = model_->Backward(); !s.ok()) return s;
    const Clock::time_point t3 = Clock::now();
    absl::StatusOr<nn::HostTensors> grads = model_->Gradients();
    if (!grads.ok()) return grads.status();
    const Clock::time_point t4 = Clock::now();
    if (phases != nullptr) {
      phases->forward = Ms(t0, t1);
      phases->loss = Ms(t1, t2);
      phases->backward = Ms(t2, t3);
      phases->gradients = Ms(t3, t4);
    }
    return absl::OkStatus();
  }

 private:
  nn::Model* model_;
  const std::vector<float>* images_;
  const std::vector<int32_t>* labels_;
  int64_t batch_;
};

int Main() {
  const int64_t depth = absl::GetFlag(FLAGS_depth);
  const int64_t width = absl::GetFlag(FLAGS_width);
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  const int threads = absl::GetFlag(FLAGS_threads);
  const std::string device = absl::GetFlag(FLAGS_device);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int iters = absl::GetFlag(FLAGS_iters);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (batch < 1 || threads < 1 || warmup < 0 || iters < 1 ||
      (device != "cpu" && device != "gpu")) {
    std::fprintf(stderr,
                 "model_step_benchmark: need --batch >= 1, --threads >= 1, "
                 "--warmup >= 0, --iters >= 1, --device=cpu|gpu\n");
    return 2;
  }
  omp_set_num_threads(threads);

  std::unique_ptr<nn::Backend> backend;
  if (device == "gpu") {
    std::string why;
    if (bn::CudaDeviceCount(&why) == 0) {
      std::fprintf(stderr, "model_step_benchmark: no CUDA device: %s\n",
                   why.c_str());
      return 1;
    }
    absl::StatusOr<std::unique_ptr<nn::Backend>> gpu = nn::NewCudaBackend(0);
    if (!gpu.ok()) {
      std::fprintf(stderr, "model_step_benchmark: %s\n",
                   gpu.status().ToString().c_str());
      return 1;
    }
    backend = *std::move(gpu);
  } else {
    backend = nn::NewCpuBackend();
  }

  nn::ModelOptions options;
  options.depth = depth;
  options.width = width;
  absl::StatusOr<std::unique_ptr<nn::Model>> model =
      nn::Model::Create(options, backend.get());
  if (!model.ok()) {
    std::fprintf(stderr, "model_step_benchmark: %s\n",
                 model.status().ToString().c_str());
    return 2;
  }
  nn::LocalBnExchange sync;
  (*model)->SetBnExchange(&sync);
  (*model)->SetBnMode(nn::BnMode::kTrain);
  if (absl::Status s =
          (*model)->SetParameters((*model)->InitialParameters(seed));
      !s.ok()) {
    std::fprintf(stderr, "model_step_benchmark: %s\n", s.ToString().c_str());
    return 1;
  }

  // Normalized images (about mean 0, std 1, as Fashion-MNIST after the
  // input normalization) and uniform labels.
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + 7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> label(
      0, static_cast<int32_t>(options.classes - 1));
  std::vector<float> images(batch * options.in_channels *
                            options.image_height * options.image_width);
  for (float& v : images) v = normal(rng);
  std::vector<int32_t> labels(batch);
  for (int32_t& l : labels) l = label(rng);

  std::printf(
      "bnps_config device=%s backend=%s depth=%lld width=%lld batch=%lld "
      "threads=%d weights=%lld warmup=%d iters=%d\n",
      device.c_str(), backend->name().c_str(), static_cast<long long>(depth),
      static_cast<long long>(width), static_cast<long long>(batch), threads,
      static_cast<long long>((*model)->num_weights()), warmup, iters);

  Bench bench(model->get(), &images, &labels, batch);
  for (int i = 0; i < warmup; ++i) {
    if (absl::Status s = bench.Step(nullptr); !s.ok()) {
      std::fprintf(stderr, "model_step_benchmark: %s\n", s.ToString().c_str());
      return 1;
    }
  }

  std::vector<double> steps;
  steps.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    const Clock::time_point t0 = Clock::now();
    if (absl::Status s = bench.Step(nullptr); !s.ok()) {
      std::fprintf(stderr, "model_step_benchmark: %s\n", s.ToString().c_str());
      return 1;
    }
    steps.push_back(Ms(t0, Clock::now()));
  }
  std::printf("bnps_step_ms p50=%.4f mean=%.4f min=%.4f\n", Median(steps),
              Mean(steps), *std::min_element(steps.begin(), steps.end()));

  std::vector<double> fwd, loss, bwd, grads;
  for (int i = 0; i < iters; ++i) {
    Phases p;
    if (absl::Status s = bench.Step(&p); !s.ok()) {
      std::fprintf(stderr, "model_step_benchmark: %s\n", s.ToString().c_str());
      return 1;
    }
    fwd.push_back(p.forward);
    loss.push_back(p.loss);
    bwd.push_back(p.backward);
    grads.push_back(p.gradients);
  }
  const double f = Median(fwd), l = Median(loss), b = Median(bwd),
               g = Median(grads);
  std::printf(
      "bnps_phase_ms forward=%.4f loss=%.4f backward=%.4f gradients=%.4f "
      "total=%.4f\n",
      f, l, b, g, f + l + b + g);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace bnps::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times Forward + Loss + Backward + Gradients of the worker's model "
      "(local BN, no servers). Prints bnps_step_ms p50=.. mean=.. min=.. and "
      "a per-phase line.");
  absl::ParseCommandLine(argc, argv);
  return bnps::bench::Main();
}
