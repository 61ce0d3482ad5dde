// BatchNorm (layers.h): the layer whose statistics go through a BnExchange.

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nn/layers.h"

namespace bnps::nn {
namespace {

absl::Status ShapeError(const std::string& layer, const bn::Shape& in,
                        const std::string& want) {
  return absl::InvalidArgumentError(absl::StrCat(
      "layer ", layer, " cannot take input ", in.ToString(), ": ", want));
}

}  // namespace

// ---------------------------------------------------------------- BatchNorm

absl::StatusOr<std::unique_ptr<BatchNorm>> BatchNorm::Create(
    Backend& backend, std::string name, int64_t channels, double momentum,
    double eps) {
  if (channels < 1 || !(momentum >= 0 && momentum <= 1) || !(eps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad batch norm ", name, ": ", channels,
                     " channels, momentum ", momentum, ", eps ", eps));
  }
  std::unique_ptr<BatchNorm> layer(
      new BatchNorm(backend, name, channels, momentum, eps));
  absl::StatusOr<std::unique_ptr<Parameter>> gamma =
      NewParameter(backend, name + ".gamma", {channels});
  if (!gamma.ok()) return gamma.status();
  absl::StatusOr<std::unique_ptr<Parameter>> beta =
      NewParameter(backend, name + ".beta", {channels});
  if (!beta.ok()) return beta.status();
  layer->gamma_ = *std::move(gamma);
  layer->beta_ = *std::move(beta);
  if (absl::Status s = layer->gamma_->SetValue(
          backend, std::vector<float>(channels, 1.0f));
      !s.ok()) {
    return s;
  }
  return layer;
}

BatchNorm::BatchNorm(Backend& backend, std::string name, int64_t channels,
                     double momentum, double eps)
    : Layer(std::move(name)),
      backend_(backend),
      channels_(channels),
      momentum_(momentum),
      eps_(eps),
      running_(bn::RunningStats::Initial(channels)),
      collected_(bn::Moments::Empty(channels)) {}

absl::StatusOr<bn::Shape> BatchNorm::OutputShape(const bn::Shape& in) const {
  if (in.c != channels_) {
    return ShapeError(name(), in, absl::StrCat(channels_, " channels"));
  }
  return in;
}

bn::Normalization BatchNorm::Norm() const {
  return bn::Normalization{mean_, var_, gamma_->host, beta_->host, eps_};
}

absl::Status BatchNorm::set_running(bn::RunningStats running) {
  if (static_cast<int64_t>(running.mean.size()) != channels_ ||
      static_cast<int64_t>(running.var.size()) != channels_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "running stats of ", name(), " need ", channels_, " channels"));
  }
  for (int64_t c = 0; c < channels_; ++c) {
    if (!std::isfinite(running.mean[c]) || !std::isfinite(running.var[c]) ||
        running.var[c] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "running stats of ", name(), " are not finite or negative at ", c));
    }
  }
  running_ = std::move(running);
  return absl::OkStatus();
}

absl::StatusOr<const Tensor*> BatchNorm::Forward(const Tensor& x) {
  if (absl::StatusOr<bn::Shape> out = OutputShape(x.shape); !out.ok()) {
    return out.status();
  }
  if (absl::Status s = Resize(backend_, x.shape, &y_); !s.ok()) return s;
  trained_ = false;
  switch (mode_) {
    case BnMode::kInference:
      mean_ = running_.mean;
      var_ = running_.var;
      break;
    case BnMode::kCollect: {
      absl::StatusOr<bn::Moments> local =
          backend_.bn().ComputeMoments(x.data(), x.shape);
      if (!local.ok()) return local.status();
      collected_ = *std::move(local);
      mean_ = collected_.mean;
      var_ = bn::BiasedVariance(collected_);
      break;
    }
    case BnMode::kTrain: {
      if (sync_ == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("batch norm ", name(), " trains without a BnExchange"));
      }
      absl::StatusOr<bn::Moments> local =
          backend_.bn().ComputeMoments(x.data(), x.shape);
      if (!local.ok()) return local.status();
      absl::StatusOr<bn::Moments> merged = sync_->Forward(name(), *local);
      if (!merged.ok()) return merged.status();
      if (merged->channels() != channels_ || merged->count < local->count) {
        return absl::InternalError(absl::StrCat(
            "batch norm ", name(), ": the BN sync returned ",
            merged->channels(), " channels over ", merged->count,
            " samples for a local ", local->count));
      }
      mean_ = merged->mean;
      var_ = bn::BiasedVariance(*merged);
      count_ = merged->count;
      if (count_ > 1) {
        if (absl::Status s =
                bn::UpdateRunningStats(*merged, momentum_, &running_);
            !s.ok()) {
          return s;
        }
      }
      trained_ = true;
      break;
    }
  }
  if (absl::Status s =
          backend_.bn().Normalize(x.data(), x.shape, Norm(), y_.data());
      !s.ok()) {
    return s;
  }
  x_ = &x;
  return &y_;
}

absl::StatusOr<const Tensor*> BatchNorm::Backward(const Tensor& dy,
                                                  bool need_dx) {
  if (!trained_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "batch norm ", name(), ": Backward needs a training-mode Forward"));
  }
  const bn::Normalization norm = Norm();
  absl::StatusOr<bn::BackwardSums> local =
      backend_.bn().BackwardReduce(dy.data(), x_->data(), x_->shape, norm);
  if (!local.ok()) return local.status();
  absl::StatusOr<bn::BackwardSums> reduced;
  if (later_ != nullptr && !later_->empty()) {
    // The deferred work does not depend on the exchange: it runs while the
    // exchange is in flight.
    std::unique_ptr<PendingBackward> pending =
        sync_->StartBackward(name(), *local);
    absl::Status work;
    for (const auto& w : *later_) {
      if (work.ok()) work = w();
    }
    later_->clear();
    reduced = pending->Wait();
    // The exchange's error first: it may be one the job recovers from (a
    // server restarted), which the trainer must see.
    if (!reduced.ok()) return reduced.status();
    if (!work.ok()) return work;
  } else {
    reduced = sync_->Backward(name(), *local);
  }
  if (!reduced.ok()) return reduced.status();
  // dgamma and dbeta are this worker's own sums; the servers add them up.
  grad_host_.assign(local->sum_dy_xhat.begin(), local->sum_dy_xhat.end());
  if (absl::Status s = backend_.CopyToDevice(grad_host_.data(), channels_,
                                             gamma_->grad.data());
      !s.ok()) {
    return s;
  }
  grad_host_.assign(local->sum_dy.begin(), local->sum_dy.end());
  if (absl::Status s = backend_.CopyToDevice(grad_host_.data(), channels_,
                                             beta_->grad.data());
      !s.ok()) {
    return s;
  }
  if (!need_dx) return nullptr;
  if (absl::Status s = Resize(backend_, x_->shape, &dx_); !s.ok()) return s;
  if (absl::Status s =
          backend_.bn().BackwardInput(dy.data(), x_->data(), x_->shape, norm,
                                      *reduced, count_, dx_.data());
      !s.ok()) {
    return s;
  }
  return &dx_;
}

void BatchNorm::AppendParameters(std::vector<Parameter*>* out) {
  out->push_back(gamma_.get());
  out->push_back(beta_.get());
}

}  // namespace bnps::nn
