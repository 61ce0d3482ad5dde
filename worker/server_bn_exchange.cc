#include "worker/server_bn_exchange.h"

#include <utility>

#include "absl/time/clock.h"
#include "policy/async_bn.h"

namespace bnps::worker {

absl::StatusOr<bn::Moments> ServerBnExchange::Forward(
    const std::string& layer, const bn::Moments& local) {
  const absl::Time start = absl::Now();
  absl::StatusOr<client::BnForwardResult> r =
      client_->BnForward(layer, step_, local);
  const absl::Duration took = absl::Now() - start;
  elapsed_ += took;
  if (metrics_ != nullptr) {
    metrics_->BnRoundTrip(layer, WorkerMetrics::kForward, took);
  }
  if (!r.ok()) return r.status();
  if (policy_ == policy::Policy::kSync) return std::move(r->merged);
  // async: the servers sent the others' admissible moments.
  return policy::NormalizingMoments(local, r->merged);
}

absl::StatusOr<bn::BackwardSums> ServerBnExchange::Backward(
    const std::string& layer, const bn::BackwardSums& local) {
  if (!policy::GlobalBnBackward(policy_)) return local;
  const absl::Time start = absl::Now();
  absl::StatusOr<bn::BackwardSums> r = client_->BnBackward(layer, step_, local);
  const absl::Duration took = absl::Now() - start;
  elapsed_ += took;
  if (metrics_ != nullptr) {
    metrics_->BnRoundTrip(layer, WorkerMetrics::kBackward, took);
  }
  return r;
}

}  // namespace bnps::worker
