#include "worker/server_bn_exchange.h"

#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/time/clock.h"

namespace bnps::worker {

absl::StatusOr<bn::Moments> ServerBnExchange::Forward(
    const std::string& layer, const bn::Moments& local) {
  const absl::Time start = absl::Now();
  // The layer keeps its own running statistics (nn::BatchNorm): none are
  // asked for.
  absl::StatusOr<client::BnForwardOutcome> r =
      rule_.Forward(client_, layer, step_, local, /*tracks_running=*/false);
  const absl::Duration took = absl::Now() - start;
  elapsed_ += took;
  if (metrics_ != nullptr) {
    metrics_->BnRoundTrip(layer, WorkerMetrics::kForward, took);
  }
  if (!r.ok()) return r.status();
  return std::move(r->normalize);
}

absl::StatusOr<bn::BackwardSums> ServerBnExchange::Backward(
    const std::string& layer, const bn::BackwardSums& local) {
  if (!rule_.GlobalBackward()) return local;
  const absl::Time start = absl::Now();
  absl::StatusOr<bn::BackwardSums> r = client_->BnBackward(layer, step_, local);
  const absl::Duration took = absl::Now() - start;
  elapsed_ += took;
  if (metrics_ != nullptr) {
    metrics_->BnRoundTrip(layer, WorkerMetrics::kBackward, took);
  }
  return r;
}

namespace {

// The exchange's call on a thread of its own; Wait joins it.
class ThreadedBackward final : public nn::PendingBackward {
 public:
  ThreadedBackward(client::PsClient* client, std::string layer, int64_t step,
                   bn::BackwardSums local, absl::Duration* elapsed,
                   WorkerMetrics* metrics)
      : layer_(std::move(layer)), elapsed_(elapsed), metrics_(metrics) {
    thread_ = std::thread([this, client, step, local = std::move(local)] {
      const absl::Time start = absl::Now();
      result_ = client->BnBackward(layer_, step, local);
      took_ = absl::Now() - start;
    });
  }
  ~ThreadedBackward() override {
    if (thread_.joinable()) thread_.join();
  }

  absl::StatusOr<bn::BackwardSums> Wait() override {
    const absl::Time start = absl::Now();
    thread_.join();
    *elapsed_ += absl::Now() - start;
    if (metrics_ != nullptr) {
      metrics_->BnRoundTrip(layer_, WorkerMetrics::kBackward, took_);
    }
    return std::move(result_);
  }

 private:
  const std::string layer_;
  absl::Duration* const elapsed_;  // not owned
  WorkerMetrics* const metrics_;   // not owned; may be null
  std::thread thread_;
  // Written by the thread, read after the join.
  absl::StatusOr<bn::BackwardSums> result_;
  absl::Duration took_;
};

}  // namespace

std::unique_ptr<nn::PendingBackward> ServerBnExchange::StartBackward(
    const std::string& layer, const bn::BackwardSums& local) {
  if (!rule_.GlobalBackward()) {
    return std::make_unique<nn::DoneBackward>(local);
  }
  return std::make_unique<ThreadedBackward>(client_, layer, step_, local,
                                            &elapsed_, metrics_);
}

}  // namespace bnps::worker
