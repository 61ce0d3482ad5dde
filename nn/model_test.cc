// The whole model against finite differences, under local BN and under the
// async variant (others' moments constant), plus its bookkeeping.

#include "nn/model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "bn/moments.h"
#include "gtest/gtest.h"
#include "nn/bn_exchange.h"
#include "nn/cpu_backend.h"

namespace bnps::nn {
namespace {

// Async BN as the servers run it, with the others' moments fixed: normalize
// with merge(local, others), backward with the local sums.
class FixedOthersSync : public BnExchange {
 public:
  explicit FixedOthersSync(uint64_t seed) : rng_(seed) {}

  absl::StatusOr<bn::Moments> Forward(const std::string& layer,
                                        const bn::Moments& local) override {
    auto it = others_.find(layer);
    if (it == others_.end()) {
      bn::Moments m = bn::Moments::Empty(local.channels());
      m.count = 37;
      std::uniform_real_distribution<double> u(-0.5, 0.5);
      for (int64_t c = 0; c < m.channels(); ++c) {
        m.mean[c] = u(rng_);
        m.m2[c] = m.count * (1.0 + u(rng_));
      }
      it = others_.emplace(layer, m).first;
    }
    return bn::MergeMoments({local, it->second});
  }
  absl::StatusOr<bn::BackwardSums> Backward(
      const std::string& layer, const bn::BackwardSums& local) override {
    return local;
  }

 private:
  std::mt19937_64 rng_;
  std::map<std::string, bn::Moments> others_;
};

ModelOptions Tiny(Architecture a = Architecture::kCnn) {
  ModelOptions o;
  o.architecture = a;
  o.depth = 1;
  o.width = 2;
  o.image_height = 6;
  o.image_width = 6;
  o.classes = 3;
  return o;
}

struct Batch {
  std::vector<float> images;
  std::vector<int32_t> labels;
  int64_t n = 0;
};

Batch RandomBatch(const ModelOptions& o, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Batch b;
  b.n = n;
  b.images.resize(n * o.in_channels * o.image_height * o.image_width);
  for (float& v : b.images) v = normal(rng);
  for (int64_t i = 0; i < n; ++i) b.labels.push_back(rng() % o.classes);
  return b;
}

// Parameters away from the symmetric start, so every term of the gradient
// matters (gamma != 1, beta != 0).
HostTensors Perturbed(const Model& model, uint64_t seed) {
  HostTensors p = model.InitialParameters(seed);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> u(-0.3f, 0.3f);
  for (auto& [name, t] : p) {
    for (float& v : t.values) v += u(rng);
  }
  return p;
}

double LossAt(Model& model, const HostTensors& params, const Batch& b) {
  EXPECT_TRUE(model.SetParameters(params).ok());
  EXPECT_TRUE(model.Forward(b.images.data(), b.n).ok());
  absl::StatusOr<LossResult> r = model.Loss(b.labels.data());
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->loss_sum : NAN;
}

// Central differences for a sample of each parameter tensor's elements; the
// relative error of each tensor's sampled gradient must be small. Float
// arithmetic and ReLU/max-pool kinks make single elements noisy, so tensors
// are compared as vectors.
void CheckGradients(BnExchange* sync, uint64_t seed,
                    Architecture a = Architecture::kCnn) {
  SCOPED_TRACE(ArchitectureName(a));
  std::unique_ptr<Backend> backend = NewCpuBackend();
  const ModelOptions o = Tiny(a);
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(o, backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  m.SetBnExchange(sync);
  const Batch batch = RandomBatch(o, 5, seed);
  HostTensors params = Perturbed(m, seed);

  ASSERT_TRUE(m.SetParameters(params).ok());
  ASSERT_TRUE(m.Forward(batch.images.data(), batch.n).ok());
  ASSERT_TRUE(m.Loss(batch.labels.data()).ok());
  ASSERT_TRUE(m.Backward().ok());
  absl::StatusOr<HostTensors> grads = m.Gradients();
  ASSERT_TRUE(grads.ok()) << grads.status();

  std::mt19937_64 rng(seed + 7);
  // Small steps: local BN over 20 samples per channel is strongly curved, and
  // larger steps cross ReLU kinks (errors shrink with h: 3e-3 fails here,
  // 3e-4 passes; a wrong formula gives errors of order 1).
  const float h = 3e-4f;
  int checked_tensors = 0;
  for (auto& [name, t] : params) {
    const std::vector<float>& analytic = grads->at(name).values;
    double diff2 = 0, norm2 = 0;
    const int samples = std::min<int>(8, t.values.size());
    for (int s = 0; s < samples; ++s) {
      const size_t i = t.values.size() <= 8 ? s : rng() % t.values.size();
      const float saved = t.values[i];
      t.values[i] = saved + h;
      const double up = LossAt(m, params, batch);
      t.values[i] = saved - h;
      const double down = LossAt(m, params, batch);
      t.values[i] = saved;
      const double fd = (up - down) / (2.0 * h);
      diff2 += (fd - analytic[i]) * (fd - analytic[i]);
      norm2 += analytic[i] * analytic[i];
    }
    EXPECT_LE(std::sqrt(diff2), 3e-2 * std::sqrt(norm2) + 2e-3)
        << name << ": |fd - analytic| = " << std::sqrt(diff2)
        << ", |analytic| = " << std::sqrt(norm2);
    ++checked_tensors;
  }
  EXPECT_EQ(checked_tensors, static_cast<int>(m.parameters().size()));
}

TEST(ModelTest, GradientsMatchFiniteDifferencesWithLocalBn) {
  LocalBnExchange sync;
  CheckGradients(&sync, 11);
}

TEST(ModelTest, GradientsMatchFiniteDifferencesWithAsyncBn) {
  FixedOthersSync sync(5);
  CheckGradients(&sync, 23);
}

// The variants: deep (BN down to 1x1 maps on 6x6 images) and fc_bn (BN over
// the batch alone), against finite differences under local and async BN.
// The variants' own wiring (their layers' backward, in their order), through
// one exchange: the one with other workers' moments, whose BN gradient
// includes every term local BN's does (the two tests above check both BN
// formulas on the default model).
TEST(ModelTest, VariantGradientsMatchFiniteDifferences) {
  for (Architecture a : {Architecture::kDeep, Architecture::kFcBn}) {
    FixedOthersSync async(7);
    CheckGradients(&async, 37, a);
  }
}

TEST(ModelTest, ArchitectureNames) {
  for (Architecture a :
       {Architecture::kCnn, Architecture::kDeep, Architecture::kFcBn}) {
    absl::StatusOr<Architecture> back = ParseArchitecture(ArchitectureName(a));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, a);
  }
  absl::StatusOr<Architecture> bad = ParseArchitecture("resnet50");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("cnn, deep or fc_bn"),
            std::string::npos);
}

// Shapes on 28x28: BN layers, their fewest positions per example, the head.
TEST(ModelTest, VariantShapesAndPositionsPerExample) {
  struct Case {
    Architecture a;
    size_t bn_layers;
    int64_t positions;
    std::vector<int64_t> head;
  } cases[] = {
      // stem, 2 blocks x 2, down
      {Architecture::kCnn, 6, 49, {10, 32}},
      // + down2, down3, 2 more blocks x 2
      {Architecture::kDeep, 12, 4, {10, 64}},
      // two hidden layers of 8 x 16 units
      {Architecture::kFcBn, 2, 1, {10, 128}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(ArchitectureName(c.a));
    std::unique_ptr<Backend> backend = NewCpuBackend();
    ModelOptions o;
    o.architecture = c.a;
    absl::StatusOr<std::unique_ptr<Model>> model =
        Model::Create(o, backend.get());
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->batch_norms().size(), c.bn_layers);
    EXPECT_EQ((*model)->bn_positions_per_example(), c.positions);
    const HostTensors p = (*model)->InitialParameters(1);
    EXPECT_EQ(p.at("head.fc.w").shape, c.head);
    if (c.a == Architecture::kFcBn) {
      EXPECT_EQ(p.at("fc0.w").shape, (std::vector<int64_t>{128, 784}));
      EXPECT_EQ(p.at("fc0.bn.gamma").shape, (std::vector<int64_t>{128}));
    }
    if (c.a == Architecture::kDeep) {
      EXPECT_EQ(p.at("down3.conv.w").shape,
                (std::vector<int64_t>{64, 64, 3, 3}));
      EXPECT_EQ(p.count("stage4.block0.bn2.gamma"), 1u);
    }
    ASSERT_TRUE((*model)->SetParameters(p).ok());
    LocalBnExchange sync;
    (*model)->SetBnExchange(&sync);
    const Batch batch = RandomBatch(o, 3, 1);
    ASSERT_TRUE((*model)->Forward(batch.images.data(), 3).ok());
    EXPECT_EQ((*model)->logits().size(), 30u);
    ASSERT_TRUE((*model)->Loss(batch.labels.data()).ok());
    ASSERT_TRUE((*model)->Backward().ok());
  }
}

// One sample per worker under local BN in fc_bn: each BN layer normalizes
// one value per channel by itself (variance 0), so its output is beta
// whatever the image, and no gradient reaches the layers below it. (With
// sync or async BN the moments are over more samples and both are normal;
// tests/training_test.cc checks sync at batch 1 against one worker.)
TEST(ModelTest, FcBnWithOneLocalSampleIsDegenerate) {
  std::unique_ptr<Backend> backend = NewCpuBackend();
  const ModelOptions o = Tiny(Architecture::kFcBn);
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(o, backend.get());
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  LocalBnExchange local;
  m.SetBnExchange(&local);
  ASSERT_TRUE(m.SetParameters(Perturbed(m, 5)).ok());
  const Batch a = RandomBatch(o, 1, 1), b = RandomBatch(o, 1, 2);
  ASSERT_TRUE(m.Forward(a.images.data(), 1).ok());
  const std::vector<float> logits_a = m.logits();
  ASSERT_TRUE(m.Loss(a.labels.data()).ok());
  ASSERT_TRUE(m.Backward().ok());
  absl::StatusOr<HostTensors> g = m.Gradients();
  ASSERT_TRUE(g.ok());
  // Zero up to rounding (x - mean of one sample in float arithmetic, over
  // sqrt(eps)): far below the same weights' gradient at batch 2.
  auto largest = [](const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max<double>(m, std::abs(x));
    return m;
  };
  const double below1 =
      std::max(largest(g->at("fc0.w").values), largest(g->at("fc1.w").values));
  const double beta = largest(g->at("fc1.bn.beta").values);
  const Batch two = RandomBatch(o, 2, 9);
  ASSERT_TRUE(m.Forward(two.images.data(), 2).ok());
  ASSERT_TRUE(m.Loss(two.labels.data()).ok());
  ASSERT_TRUE(m.Backward().ok());
  g = m.Gradients();
  ASSERT_TRUE(g.ok());
  const double below2 =
      std::min(largest(g->at("fc0.w").values), largest(g->at("fc1.w").values));
  EXPECT_GT(beta, 1e-3);
  EXPECT_LT(below1, 1e-3 * below2) << below1 << " vs " << below2;
  ASSERT_TRUE(m.Forward(b.images.data(), 1).ok());
  EXPECT_EQ(m.logits(), logits_a);
  // Normalized with more samples (async's merge), the image matters again.
  FixedOthersSync async(3);
  m.SetBnExchange(&async);
  ASSERT_TRUE(m.Forward(a.images.data(), 1).ok());
  const std::vector<float> async_a = m.logits();
  ASSERT_TRUE(m.Forward(b.images.data(), 1).ok());
  EXPECT_NE(m.logits(), async_a);
}

TEST(ModelTest, DefaultModelShapesAndParameters) {
  std::unique_ptr<Backend> backend = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create(ModelOptions(), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  // stem, 2 blocks x 2, down: 6 BN layers.
  EXPECT_EQ((*model)->batch_norms().size(), 6u);
  const HostTensors a = (*model)->InitialParameters(1);
  const HostTensors b = (*model)->InitialParameters(1);
  const HostTensors c = (*model)->InitialParameters(2);
  EXPECT_EQ(a.size(), (*model)->parameters().size());
  EXPECT_EQ(a.at("stem.conv.w").values, b.at("stem.conv.w").values);
  EXPECT_NE(a.at("stem.conv.w").values, c.at("stem.conv.w").values);
  EXPECT_EQ(a.at("head.fc.w").shape, (std::vector<int64_t>{10, 32}));
  EXPECT_EQ(a.at("stem.bn.gamma").values, std::vector<float>(16, 1.0f));
  ASSERT_TRUE((*model)->SetParameters(a).ok());
  LocalBnExchange sync;
  (*model)->SetBnExchange(&sync);
  const Batch batch = RandomBatch(ModelOptions(), 3, 1);
  ASSERT_TRUE((*model)->Forward(batch.images.data(), 3).ok());
  EXPECT_EQ((*model)->logits().size(), 30u);
}

TEST(ModelTest, EmptyBatchGivesZeroGradients) {
  std::unique_ptr<Backend> backend = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create(Tiny(), backend.get());
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  LocalBnExchange sync;
  m.SetBnExchange(&sync);
  ASSERT_TRUE(m.SetParameters(Perturbed(m, 3)).ok());
  // A real batch first, so stale gradients would show.
  const Batch batch = RandomBatch(Tiny(), 4, 2);
  ASSERT_TRUE(m.Forward(batch.images.data(), 4).ok());
  ASSERT_TRUE(m.Loss(batch.labels.data()).ok());
  ASSERT_TRUE(m.Backward().ok());
  ASSERT_TRUE(m.Forward(nullptr, 0).ok());
  absl::StatusOr<LossResult> loss = m.Loss(nullptr);
  ASSERT_TRUE(loss.ok());
  EXPECT_EQ(loss->loss_sum, 0.0);
  ASSERT_TRUE(m.Backward().ok());
  absl::StatusOr<HostTensors> grads = m.Gradients();
  ASSERT_TRUE(grads.ok());
  for (const auto& [name, g] : *grads) {
    for (float v : g.values) ASSERT_EQ(v, 0.0f) << name;
  }
}

// Backward(on_final) reports each layer's parameters once, layers in reverse
// model order, with gradients that are final when reported: equal, bit for
// bit, to those of the plain Backward.
TEST(ModelTest, BackwardReportsEachLayersGradientsOnceTheyAreFinal) {
  std::unique_ptr<Backend> backend = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create(Tiny(), backend.get());
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  LocalBnExchange sync;
  m.SetBnExchange(&sync);
  ASSERT_TRUE(m.SetParameters(Perturbed(m, 5)).ok());
  const Batch batch = RandomBatch(Tiny(), 4, 6);
  auto step = [&]() {
    ASSERT_TRUE(m.Forward(batch.images.data(), batch.n).ok());
    ASSERT_TRUE(m.Loss(batch.labels.data()).ok());
  };
  step();
  ASSERT_TRUE(m.Backward().ok());
  absl::StatusOr<HostTensors> plain = m.Gradients();
  ASSERT_TRUE(plain.ok());

  step();
  std::map<const Parameter*, size_t> index;
  for (size_t i = 0; i < m.parameters().size(); ++i) {
    index[m.parameters()[i]] = i;
  }
  std::vector<std::vector<size_t>> spans;
  HostTensors reported;
  ASSERT_TRUE(m.Backward([&](absl::Span<const Parameter* const> params) {
                 spans.emplace_back();
                 for (const Parameter* p : params) {
                   spans.back().push_back(index.at(p));
                 }
                 absl::StatusOr<HostTensors> g = m.Gradients(params);
                 if (!g.ok()) return g.status();
                 for (auto& [name, t] : *g) {
                   EXPECT_TRUE(reported.emplace(name, std::move(t)).second)
                       << name << " reported twice";
                 }
                 return absl::OkStatus();
               }).ok());
  ASSERT_GT(spans.size(), 2u);
  // Contiguous spans, walking down from the last parameter to the first.
  size_t next_end = m.parameters().size();
  for (const std::vector<size_t>& span : spans) {
    ASSERT_FALSE(span.empty());
    for (size_t i = 0; i < span.size(); ++i) {
      EXPECT_EQ(span[i], next_end - span.size() + i);
    }
    next_end -= span.size();
  }
  EXPECT_EQ(next_end, 0u);
  ASSERT_EQ(reported.size(), plain->size());
  for (const auto& [name, t] : *plain) {
    EXPECT_EQ(reported.at(name).values, t.values) << name;
  }

  // An error from on_final ends the pass with it.
  step();
  int calls = 0;
  absl::Status s = m.Backward([&](absl::Span<const Parameter* const>) {
    return ++calls == 2 ? absl::UnavailableError("push failed")
                        : absl::OkStatus();
  });
  EXPECT_EQ(s, absl::UnavailableError("push failed"));
  EXPECT_EQ(calls, 2);
}

// Local BN whose backward exchange, when started, looks at a convolution's
// weight gradient at the start and at the wait.
class WatchingExchange : public LocalBnExchange {
 public:
  WatchingExchange(Backend* backend, const Parameter* watched,
                   std::string layer)
      : backend_(backend), watched_(watched), layer_(std::move(layer)) {}

  std::unique_ptr<PendingBackward> StartBackward(
      const std::string& layer, const bn::BackwardSums& local) override {
    started_.push_back(layer);
    if (layer == layer_) at_start_ = Grad();
    class Pending : public PendingBackward {
     public:
      Pending(WatchingExchange* x, bool watch, bn::BackwardSums local)
          : x_(x), watch_(watch), local_(std::move(local)) {}
      absl::StatusOr<bn::BackwardSums> Wait() override {
        if (watch_) x_->at_wait_ = x_->Grad();
        return local_;
      }

     private:
      WatchingExchange* x_;
      bool watch_;
      bn::BackwardSums local_;
    };
    return std::make_unique<Pending>(this, layer == layer_, local);
  }

  std::vector<float> Grad() const {
    std::vector<float> g(watched_->elements());
    EXPECT_TRUE(
        backend_->CopyToHost(watched_->grad.data(), g.size(), g.data()).ok());
    return g;
  }

  Backend* backend_;
  const Parameter* watched_;
  std::string layer_;
  std::vector<std::string> started_;
  std::vector<float> at_start_, at_wait_;
};

// With the backward overlap, a block's first BN starts its exchange, the
// block's second convolution computes its weight gradient meanwhile, and the
// BN then waits; every gradient is what the plain pass computes, bit for bit.
// Parameters set layer by layer during Forward (as a layer-by-layer pull
// does) give the logits of parameters set before it, bit for bit; each
// comes once, in model order, just before its layer.
TEST(ModelTest, ForwardAsksForEachLayersParametersBeforeTheLayer) {
  std::unique_ptr<Backend> backend = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create(Tiny(), backend.get());
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  LocalBnExchange sync;
  m.SetBnExchange(&sync);
  const Batch batch = RandomBatch(Tiny(), 4, 6);
  const HostTensors values = Perturbed(m, 5);
  ASSERT_TRUE(m.SetParameters(values).ok());
  ASSERT_TRUE(m.Forward(batch.images.data(), batch.n).ok());
  const std::vector<float> want = m.logits();

  ASSERT_TRUE(m.SetParameters(Perturbed(m, 9)).ok());  // other values
  size_t next = 0;
  ASSERT_TRUE(m.Forward(batch.images.data(), batch.n,
                        [&](absl::Span<Parameter* const> params) {
                          for (Parameter* p : params) {
                            EXPECT_EQ(p, m.parameters()[next]) << next;
                            ++next;
                            const HostTensor& t = values.at(p->name);
                            if (absl::Status s =
                                    m.SetParameter(p, t.shape, t.values);
                                !s.ok()) {
                              return s;
                            }
                          }
                          return absl::OkStatus();
                        })
                  .ok());
  EXPECT_EQ(next, m.parameters().size());
  EXPECT_EQ(m.logits(), want);

  // A wrong shape is refused; an error from the callback ends the pass.
  Parameter* first = m.parameters()[0];
  EXPECT_EQ(m.SetParameter(first, {1}, {0.0f}).code(),
            absl::StatusCode::kInvalidArgument);
  int calls = 0;
  const absl::Status s = m.Forward(
      batch.images.data(), batch.n, [&](absl::Span<Parameter* const>) {
        return ++calls == 2 ? absl::DeadlineExceededError("pull timed out")
                            : absl::OkStatus();
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(calls, 2);
}

TEST(ModelTest, BackwardOverlapComputesTheNextWeightGradientDuringTheExchange) {
  std::unique_ptr<Backend> backend = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create(Tiny(), backend.get());
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  const Parameter* conv2 = nullptr;
  for (const Parameter* p : m.parameters()) {
    if (p->name == "stage2.block0.conv2.w") conv2 = p;
  }
  ASSERT_NE(conv2, nullptr);
  WatchingExchange sync(backend.get(), conv2, "stage2.block0.bn1");
  m.SetBnExchange(&sync);
  ASSERT_TRUE(m.SetParameters(Perturbed(m, 7)).ok());
  const Batch batch = RandomBatch(Tiny(), 4, 8);
  auto pass = [&]() -> HostTensors {
    EXPECT_TRUE(m.Forward(batch.images.data(), batch.n).ok());
    EXPECT_TRUE(m.Loss(batch.labels.data()).ok());
    EXPECT_TRUE(m.Backward().ok());
    absl::StatusOr<HostTensors> g = m.Gradients();
    EXPECT_TRUE(g.ok());
    return g.ok() ? *g : HostTensors();
  };
  const HostTensors plain = pass();
  EXPECT_TRUE(sync.started_.empty());  // off by default

  // Stale values first, so the test sees when the gradient is computed.
  for (Parameter* p : m.parameters()) {
    ASSERT_TRUE(backend->Zero(p->grad.data(), p->grad.size()).ok());
  }
  m.SetBackwardOverlap(true);
  const HostTensors overlapped = pass();
  EXPECT_EQ(sync.started_, (std::vector<std::string>{"stage2.block0.bn1",
                                                     "stage1.block0.bn1"}));
  EXPECT_EQ(sync.at_start_, std::vector<float>(conv2->elements(), 0.0f));
  EXPECT_EQ(sync.at_wait_, plain.at(conv2->name).values);
  ASSERT_EQ(overlapped.size(), plain.size());
  for (const auto& [name, t] : plain) {
    EXPECT_EQ(overlapped.at(name).values, t.values) << name;
  }
}

TEST(ModelTest, BadInput) {
  std::unique_ptr<Backend> backend = NewCpuBackend();
  ModelOptions bad = Tiny();
  bad.width = 0;
  EXPECT_EQ(Model::Create(bad, backend.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create(Tiny(), backend.get());
  ASSERT_TRUE(model.ok());
  HostTensors p = (*model)->InitialParameters(1);
  p.erase("head.fc.b");
  EXPECT_EQ((*model)->SetParameters(p).code(),
            absl::StatusCode::kInvalidArgument);
  p = (*model)->InitialParameters(1);
  p["stem.conv.w"].shape = {1, 2, 3};
  EXPECT_EQ((*model)->SetParameters(p).code(),
            absl::StatusCode::kInvalidArgument);
  // Training needs a BnExchange; backward needs a training forward.
  ASSERT_TRUE((*model)->SetParameters((*model)->InitialParameters(1)).ok());
  const Batch batch = RandomBatch(Tiny(), 2, 1);
  EXPECT_EQ((*model)->Forward(batch.images.data(), 2).code(),
            absl::StatusCode::kFailedPrecondition);
  (*model)->SetBnMode(BnMode::kInference);
  ASSERT_TRUE((*model)->Forward(batch.images.data(), 2).ok());
  ASSERT_TRUE((*model)->Loss(batch.labels.data()).ok());
  EXPECT_EQ((*model)->Backward().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace bnps::nn
