#include "nn/model.h"

#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace bnps::nn {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Uniform in [0, 1) from the top 53 bits: the same on every platform, unlike
// the <random> distributions.
double Uniform(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

double Normal(std::mt19937_64& rng) {  // Box-Muller
  const double u1 = 1.0 - Uniform(rng);  // (0, 1]
  const double u2 = Uniform(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

// Mixes a parameter's name into the seed of its initial values. FNV-1a in
// shape but with its own offset (not FNV's basis and not proto::Fnv1a64, which
// routes keys): changing it would change every initial value, and with them
// the published results (README, docs/results.md).
uint64_t ParameterStreamSeed(const std::string& name) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace

absl::StatusOr<Architecture> ParseArchitecture(const std::string& name) {
  if (name == "cnn") return Architecture::kCnn;
  if (name == "deep") return Architecture::kDeep;
  if (name == "fc_bn") return Architecture::kFcBn;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model '", name, "'; expected cnn, deep or fc_bn"));
}

std::string ArchitectureName(Architecture a) {
  switch (a) {
    case Architecture::kCnn: return "cnn";
    case Architecture::kDeep: return "deep";
    case Architecture::kFcBn: return "fc_bn";
  }
  return "?";
}

absl::Status ValidateModelOptions(const ModelOptions& o) {
  if (o.architecture != Architecture::kCnn &&
      o.architecture != Architecture::kDeep &&
      o.architecture != Architecture::kFcBn) {
    return absl::InvalidArgumentError("unknown architecture");
  }
  if (o.depth < 0 || o.depth > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("depth ", o.depth, " is outside [0, 64]"));
  }
  if (o.width < 1 || o.width > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("width ", o.width, " is outside [1, 4096]"));
  }
  if (o.in_channels < 1 || o.image_height < 4 || o.image_width < 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "images of ", o.in_channels, "x", o.image_height, "x", o.image_width,
        " are too small (at least 1x4x4)"));
  }
  if (o.classes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("classes ", o.classes, " < 1"));
  }
  if (!(o.bn_momentum >= 0 && o.bn_momentum <= 1) || !(o.bn_eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bn_momentum ", o.bn_momentum, " or bn_eps ", o.bn_eps, " is invalid"));
  }
  return absl::OkStatus();
}

absl::Status Model::Add(absl::StatusOr<std::unique_ptr<Layer>> layer) {
  if (!layer.ok()) return layer.status();
  (*layer)->AppendParameters(&parameters_);
  layer_params_.push_back(parameters_.size());
  (*layer)->AppendBatchNorms(&batch_norms_);
  layers_.push_back(*std::move(layer));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(
    const ModelOptions& options, Backend* backend) {
  if (absl::Status s = ValidateModelOptions(options); !s.ok()) return s;
  if (backend == nullptr) return absl::InvalidArgumentError("no backend");
  std::unique_ptr<Model> m(new Model(options, backend));
  Backend& b = *backend;
  const int64_t w = options.width;
  const double mom = options.bn_momentum, eps = options.bn_eps;
  auto bn = [&](const std::string& name,
                int64_t c) -> absl::StatusOr<std::unique_ptr<Layer>> {
    absl::StatusOr<std::unique_ptr<BatchNorm>> layer =
        BatchNorm::Create(b, name, c, mom, eps);
    if (!layer.ok()) return layer.status();
    return std::unique_ptr<Layer>(*std::move(layer));
  };
  std::vector<absl::StatusOr<std::unique_ptr<Layer>>> layers;
  if (options.architecture == Architecture::kFcBn) {
    int64_t in = options.in_channels * options.image_height * options.image_width;
    for (int64_t i = 0; i <= options.depth; ++i) {
      const std::string name = absl::StrCat("fc", i);
      layers.push_back(NewLinear(b, name, in, 8 * w));
      layers.push_back(bn(name + ".bn", 8 * w));
      layers.push_back(NewRelu(b, name + ".relu"));
      in = 8 * w;
    }
    layers.push_back(NewLinear(b, "head.fc", in, options.classes));
  } else {
    layers.push_back(NewConv2d(b, "stem.conv", options.in_channels, w, 3, 1, 1));
    layers.push_back(bn("stem.bn", w));
    layers.push_back(NewRelu(b, "stem.relu"));
    layers.push_back(NewMaxPool(b, "stem.pool", 2, 2));
    // (prefix of the down layer, prefix of the stage, channels in, out)
    struct Stage {
      std::string down, stage;
      int64_t in, out;
    };
    std::vector<Stage> stages = {{"", "stage1", w, w},
                                 {"down", "stage2", w, 2 * w}};
    if (options.architecture == Architecture::kDeep) {
      stages.push_back({"down2", "stage3", 2 * w, 4 * w});
      stages.push_back({"down3", "stage4", 4 * w, 4 * w});
    }
    for (const Stage& st : stages) {
      if (!st.down.empty()) {
        layers.push_back(
            NewConv2d(b, st.down + ".conv", st.in, st.out, 3, 2, 1));
        layers.push_back(bn(st.down + ".bn", st.out));
        layers.push_back(NewRelu(b, st.down + ".relu"));
      }
      for (int64_t i = 0; i < options.depth; ++i) {
        layers.push_back(NewResidualBlock(
            b, absl::StrCat(st.stage, ".block", i), st.out, mom, eps));
      }
    }
    layers.push_back(NewGlobalAvgPool(b, "head.pool"));
    layers.push_back(
        NewLinear(b, "head.fc", stages.back().out, options.classes));
  }
  for (auto& layer : layers) {
    if (absl::Status s = m->Add(std::move(layer)); !s.ok()) return s;
  }
  // Check the shapes flow through once, so Forward cannot fail on them.
  bn::Shape shape{1, options.in_channels, options.image_height,
                  options.image_width};
  for (const auto& layer : m->layers_) {
    absl::StatusOr<bn::Shape> next = layer->OutputShape(shape);
    if (!next.ok()) return next.status();
    // A residual block's BN layers see its input's shape.
    std::vector<BatchNorm*> bns;
    layer->AppendBatchNorms(&bns);
    if (!bns.empty()) {
      const int64_t hw = shape.h * shape.w;
      if (m->bn_positions_ == 0 || hw < m->bn_positions_) m->bn_positions_ = hw;
    }
    shape = *next;
  }
  return m;
}

int64_t Model::num_weights() const {
  int64_t n = 0;
  for (const Parameter* p : parameters_) n += p->elements();
  return n;
}

HostTensors Model::InitialParameters(uint64_t seed) const {
  HostTensors out;
  for (const Parameter* p : parameters_) {
    HostTensor t;
    t.shape = p->dims;
    t.values.assign(p->elements(), 0.0f);
    // Each parameter has its own stream, so adding a layer does not change
    // the others' initial values.
    std::mt19937_64 rng(seed ^ ParameterStreamSeed(p->name));
    if (absl::EndsWith(p->name, ".gamma")) {
      t.values.assign(p->elements(), 1.0f);
    } else if (absl::EndsWith(p->name, ".beta")) {
      // zeros
    } else if (p->dims.size() == 4) {  // convolution: He normal
      const double std = std::sqrt(2.0 * p->dims[0] / p->elements());
      for (float& v : t.values) v = static_cast<float>(std * Normal(rng));
    } else {  // linear weight [out, in] or bias [out]: +-1/sqrt(in)
      const std::string weight =
          p->name.substr(0, p->name.size() - 2) + ".w";
      int64_t fan = 1;
      for (const Parameter* q : parameters_) {
        if (q->name == weight && q->dims.size() == 2) fan = q->dims[1];
      }
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan));
      for (float& v : t.values) {
        v = static_cast<float>((2.0 * Uniform(rng) - 1.0) * bound);
      }
    }
    out.emplace(p->name, std::move(t));
  }
  return out;
}

absl::Status Model::SetParameters(const HostTensors& values) {
  for (Parameter* p : parameters_) {
    auto it = values.find(p->name);
    if (it == values.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no value for parameter ", p->name));
    }
    if (absl::Status s = SetParameter(p, it->second.shape, it->second.values);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Model::SetParameter(Parameter* p,
                                 absl::Span<const int64_t> shape,
                                 const std::vector<float>& values) {
  if (shape != absl::MakeConstSpan(p->dims)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter ", p->name, " has shape [", absl::StrJoin(p->dims, ","),
        "], got [", absl::StrJoin(shape, ","), "]"));
  }
  return p->SetValue(*backend_, values);
}

absl::StatusOr<HostTensors> Model::Gradients() const {
  return Gradients(absl::Span<const Parameter* const>(parameters_.data(),
                                                     parameters_.size()));
}

absl::StatusOr<HostTensors> Model::Gradients(
    absl::Span<const Parameter* const> params) const {
  HostTensors out;
  std::vector<Backend::HostCopy> copies;
  copies.reserve(params.size());
  for (const Parameter* p : params) {
    auto [it, inserted] = out.try_emplace(p->name);
    if (!inserted) continue;  // as before: the first of a name
    HostTensor& t = it->second;
    t.shape = p->dims;
    t.values.resize(p->elements());
    copies.push_back({p->grad.data(), p->elements(), t.values.data()});
  }
  // One wait for all of them (the GPU queues the copies on its stream).
  if (absl::Status s = backend_->CopyManyToHost(copies); !s.ok()) return s;
  return out;
}

void Model::SetBackwardOverlap(bool on) {
  for (const auto& layer : layers_) layer->set_backward_overlap(on);
}

void Model::SetBnMode(BnMode mode) {
  for (BatchNorm* bn : batch_norms_) bn->set_mode(mode);
}

void Model::SetBnExchange(BnExchange* sync) {
  for (BatchNorm* bn : batch_norms_) bn->set_sync(sync);
}

absl::Status Model::Forward(const float* images, int64_t n) {
  return Forward(images, n, nullptr);
}

absl::Status Model::Forward(const float* images, int64_t n,
                            const ParametersNeeded& before) {
  if (n < 0 || (n > 0 && images == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad batch of ", n, " images"));
  }
  const bn::Shape shape{n, options_.in_channels, options_.image_height,
                        options_.image_width};
  if (absl::Status s = Resize(*backend_, shape, &input_); !s.ok()) return s;
  if (absl::Status s =
          backend_->CopyToDevice(images, shape.Elements(), input_.data());
      !s.ok()) {
    return s;
  }
  const Tensor* t = &input_;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const size_t begin = layer_params_[i], end = layer_params_[i + 1];
    if (before && end > begin) {
      if (absl::Status s = before(absl::Span<Parameter* const>(
              parameters_.data() + begin, end - begin));
          !s.ok()) {
        return s;
      }
    }
    absl::StatusOr<const Tensor*> next = layers_[i]->Forward(*t);
    if (!next.ok()) return next.status();
    t = *next;
  }
  n_ = n;
  logits_.resize(n * options_.classes);
  return backend_->CopyToHost(t->data(), n * options_.classes, logits_.data());
}

absl::StatusOr<LossResult> Model::Loss(const int32_t* labels) {
  if (n_ > 0 && labels == nullptr) {
    return absl::InvalidArgumentError("no labels");
  }
  dlogits_host_.resize(n_ * options_.classes);
  absl::StatusOr<LossResult> r = SoftmaxCrossEntropy(
      logits_.data(), n_, options_.classes, labels, dlogits_host_.data());
  if (!r.ok()) return r.status();
  if (absl::Status s = Resize(*backend_, {n_, options_.classes, 1, 1}, &dlogits_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = backend_->CopyToDevice(
          dlogits_host_.data(), n_ * options_.classes, dlogits_.data());
      !s.ok()) {
    return s;
  }
  return r;
}

absl::Status Model::Backward() { return Backward(nullptr); }

absl::Status Model::Backward(const GradientsFinal& on_final) {
  const Tensor* d = &dlogits_;
  for (size_t i = layers_.size(); i-- > 0;) {
    absl::StatusOr<const Tensor*> prev = layers_[i]->Backward(*d, i > 0);
    if (!prev.ok()) return prev.status();
    d = *prev;
    const size_t begin = layer_params_[i], end = layer_params_[i + 1];
    if (on_final && end > begin) {
      if (absl::Status s = on_final(absl::Span<const Parameter* const>(
              parameters_.data() + begin, end - begin));
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace bnps::nn
