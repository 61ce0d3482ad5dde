// Every model architecture (model.h) on the CUDA backend against the CPU
// backend: one training step's logits and gradients, and an inference
// forward. Covers the variants' layer wiring on the GPU: BN on [n, c, 1, 1]
// after linear layers (fc_bn) and on 2x2 and 1x1 maps (deep). Skipped where
// no CUDA device is visible.

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "bn/cuda_kernels.h"
#include "gtest/gtest.h"
#include "nn/bn_exchange.h"
#include "nn/cpu_backend.h"
#include "nn/cuda_backend.h"
#include "nn/model.h"

namespace bnps::nn {
namespace {

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 1e-3, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(a[i])));
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
  }
  return diff / scale;
}

struct Step {
  std::vector<float> logits;
  HostTensors grads;
  std::vector<float> inference_logits;
};

Step RunStep(Backend* backend, const ModelOptions& o, int64_t n) {
  Step out;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(o, backend);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return out;
  Model& m = **model;
  EXPECT_TRUE(m.SetParameters(m.InitialParameters(3)).ok());
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> images(n * o.in_channels * o.image_height * o.image_width);
  for (float& v : images) v = normal(rng);
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(rng() % o.classes);
  LocalBnExchange local;
  m.SetBnExchange(&local);
  EXPECT_TRUE(m.Forward(images.data(), n).ok());
  out.logits = m.logits();
  EXPECT_TRUE(m.Loss(labels.data()).ok());
  EXPECT_TRUE(m.Backward().ok());
  absl::StatusOr<HostTensors> g = m.Gradients();
  EXPECT_TRUE(g.ok());
  if (g.ok()) out.grads = *std::move(g);
  m.SetBnMode(BnMode::kInference);
  EXPECT_TRUE(m.Forward(images.data(), n).ok());
  out.inference_logits = m.logits();
  return out;
}

TEST(ModelCudaTest, EveryArchitectureMatchesTheCpu) {
  std::string why;
  if (bn::CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  absl::StatusOr<std::unique_ptr<Backend>> gpu = NewCudaBackend(0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  for (Architecture a :
       {Architecture::kCnn, Architecture::kDeep, Architecture::kFcBn}) {
    SCOPED_TRACE(ArchitectureName(a));
    ModelOptions o;
    o.architecture = a;
    o.width = 4;
    for (int64_t n : {1, 5}) {
      SCOPED_TRACE(n);
      const Step c = RunStep(cpu.get(), o, n);
      const Step g = RunStep(gpu->get(), o, n);
      EXPECT_LT(MaxRelDiff(c.logits, g.logits), 1e-4);
      EXPECT_LT(MaxRelDiff(c.inference_logits, g.inference_logits), 1e-4);
      ASSERT_EQ(c.grads.size(), g.grads.size());
      for (const auto& [name, t] : c.grads) {
        // One sample under local BN: gradients below BN are rounding only.
        if (n == 1 && a != Architecture::kCnn && name != "head.fc.w" &&
            name != "head.fc.b") {
          continue;
        }
        EXPECT_LT(MaxRelDiff(t.values, g.grads.at(name).values), 1e-3) << name;
      }
    }
  }
}

}  // namespace
}  // namespace bnps::nn
