// The BN layers' exchange (nn/bn_exchange.h) backed by the shard
// servers through a PsClient, for the policies with BN traffic while
// training. What each policy normalizes with and whether its backward pass
// exchanges are client::WorkerBn's rules (client/worker_bn.h), the same
// bnps.torch follows: sync normalizes with the global batch's moments and
// gets the global backward sums; async normalizes with merge(own, the
// others' admissible moments) and keeps its backward local. Counts the time spent in BN calls, for the trainer's report.
//
// Thread-safety: used from one thread (the model's); StartBackward's calls
// run on one thread the exchange keeps for them (made at the first), one at
// a time.

#ifndef BNPS_WORKER_SERVER_BN_EXCHANGE_H_
#define BNPS_WORKER_SERVER_BN_EXCHANGE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "client/ps_client.h"
#include "client/worker_bn.h"
#include "policy/policy.h"
#include "nn/bn_exchange.h"
#include "worker/worker_metrics.h"

namespace bnps::worker {

class ServerBnExchange : public nn::BnExchange {
 public:
  // `client` is not owned and must outlive this. Only policies with BN
  // traffic while training (policy::BnTrafficWhileTraining) should route
  // their layers here; under the others the servers refuse the calls.
  // `metrics` (not owned; null: none) gets each call's round trip.
  ServerBnExchange(client::PsClient* client, policy::Policy policy,
                   WorkerMetrics* metrics = nullptr);

  // The step the next exchanges belong to.
  void set_step(int64_t step) { step_ = step; }
  // Time spent in BN calls since the last reset.
  absl::Duration elapsed() const { return elapsed_; }
  void reset_elapsed() { elapsed_ = absl::ZeroDuration(); }

  absl::StatusOr<bn::Moments> Forward(const std::string& layer,
                                      const bn::Moments& local) override;
  absl::StatusOr<bn::BackwardSums> Backward(
      const std::string& layer, const bn::BackwardSums& local) override;
  // Sync: the call runs on the exchange's own thread until Wait; elapsed()
  // counts only the time Wait blocks, the metrics the whole round trip. The
  // PendingBackward must not outlive this, and is waited for (Wait or its
  // destruction) before the next StartBackward.
  std::unique_ptr<nn::PendingBackward> StartBackward(
      const std::string& layer, const bn::BackwardSums& local) override;

  ~ServerBnExchange() override;

  // Runs one call at a time on a thread of its own, kept between calls (a
  // thread per call cost its creation and join on every layer).
  class CallThread;

 private:
  std::unique_ptr<CallThread> call_thread_;  // made by the first StartBackward
  client::PsClient* const client_;
  const client::WorkerBn rule_;
  WorkerMetrics* const metrics_;
  int64_t step_ = 0;
  absl::Duration elapsed_;
};

}  // namespace bnps::worker

#endif  // BNPS_WORKER_SERVER_BN_EXCHANGE_H_
