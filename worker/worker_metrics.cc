#include "worker/worker_metrics.h"

#include <utility>

namespace bnps::worker {
namespace {

// 1 ms to about 16 min: a step of a small model on a GPU to a large one on
// a CPU.
const std::vector<double> kStepBuckets = metrics::ExponentialBuckets(1e-3, 2, 20);
// 20 us to about 40 s.
const std::vector<double> kRoundTripBuckets =
    metrics::ExponentialBuckets(2e-5, 2.5, 17);

}  // namespace

WorkerMetrics::WorkerMetrics(metrics::Registry* registry,
                             std::function<absl::Time()> now)
    : now_(std::move(now)) {
  metrics::Family<metrics::Histogram>* parts = registry->AddHistogram(
      "bnps_worker_step_seconds",
      "Wall time of a training step, split: compute (data, model), bn_sync "
      "(waiting for and exchanging BN statistics), grad_sync (pull, push, "
      "clocks).",
      {"part"}, kStepBuckets);
  compute_ = parts->WithLabels({"compute"});
  bn_sync_ = parts->WithLabels({"bn_sync"});
  grad_sync_ = parts->WithLabels({"grad_sync"});
  steps_ = registry->AddCounter("bnps_worker_steps_total", "Training steps done.")
               ->WithLabels({});
  examples_ = registry
                  ->AddCounter("bnps_worker_examples_total",
                               "Training examples this worker trained on.")
                  ->WithLabels({});
  step_ = registry->AddGauge("bnps_worker_step", "Training steps done so far.")
              ->WithLabels({});
  images_per_second_ =
      registry
          ->AddGauge("bnps_worker_images_per_second",
                     "This worker's training examples per second, over the "
                     "last second or more of training.")
          ->WithLabels({});
  round_trip_family_ = registry->AddHistogram(
      "bnps_worker_bn_round_trip_seconds",
      "One BN exchange with the servers as the model sees it (forward: "
      "moments; backward: sums), by layer and phase.",
      {"layer", "phase"}, kRoundTripBuckets);
  retries_family_ = registry->AddCounter(
      "bnps_worker_retries_total",
      "Client calls retried, by the status code of the failed attempt.",
      {"code"});
  window_start_ = now_();
}

void WorkerMetrics::StepDone(absl::Duration compute, absl::Duration bn_sync,
                             absl::Duration grad_sync, int64_t examples) {
  compute_->Observe(absl::ToDoubleSeconds(compute));
  bn_sync_->Observe(absl::ToDoubleSeconds(bn_sync));
  grad_sync_->Observe(absl::ToDoubleSeconds(grad_sync));
  steps_->Increment();
  examples_->Increment(examples);
  step_->Set(static_cast<double>(steps_->Value()));
  window_examples_ += examples;
  const absl::Time now = now_();
  if (now - window_start_ >= absl::Seconds(1)) {
    images_per_second_->Set(window_examples_ /
                            absl::ToDoubleSeconds(now - window_start_));
    window_start_ = now;
    window_examples_ = 0;
  }
}

void WorkerMetrics::BnRoundTrip(const std::string& layer, BnPhase phase,
                                absl::Duration elapsed) {
  metrics::Histogram* h;
  {
    absl::MutexLock lock(&layers_mu_);
    metrics::Histogram*& slot = layers_[layer][phase];  // null until first use
    if (slot == nullptr) {
      slot = round_trip_family_->WithLabels(
          {layer, phase == kForward ? "forward" : "backward"});
    }
    h = slot;
  }
  h->Observe(absl::ToDoubleSeconds(elapsed));
}

void WorkerMetrics::Retry(absl::StatusCode code) {
  int c = static_cast<int>(code);
  if (c < 0 || c >= 17) c = static_cast<int>(absl::StatusCode::kUnknown);
  std::atomic<metrics::Counter*>& slot = retries_[c];
  metrics::Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {
    counter = retries_family_->WithLabels(
        {absl::StatusCodeToString(static_cast<absl::StatusCode>(c))});
    slot.store(counter, std::memory_order_release);
  }
  counter->Increment();
}

}  // namespace bnps::worker
