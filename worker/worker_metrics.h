// What a worker measures, registered in a metrics::Registry (metrics/
// registry.h): the step time split, throughput, the BN round trip per layer,
// and the client's retries. The trainer (worker/trainer.h) and the BN exchange
// (worker/server_bn_exchange.h) report to it; bnps_worker serves the registry
// over HTTP when asked (--metrics_port).
//
// Series (prefixed bnps_worker_; docs/observability.md has the table):
//   step_seconds{part=compute|bn_sync|grad_sync}  the step's wall time, split
//                                                  as the trainer's report
//   steps_total, examples_total, step (the steps done)
//   images_per_second        over the last second or more of steps
//   bn_round_trip_seconds{layer,phase}            one BN call, as the model sees it
//   retries_total{code}      client calls retried, by the failed attempt's code
//
// Thread-safety: Retry and BnRoundTrip are thread-safe (the client calls
// them from its threads; BnRoundTrip takes a short lock to find the
// layer's series); the rest is used from the training thread. The registry
// must outlive this.

#ifndef BNPS_WORKER_WORKER_METRICS_H_
#define BNPS_WORKER_WORKER_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "metrics/registry.h"

namespace bnps::worker {

class WorkerMetrics {
 public:
  // `registry` is not owned. `now` is the clock of images_per_second.
  explicit WorkerMetrics(metrics::Registry* registry,
                         std::function<absl::Time()> now = absl::Now);

  // One step ended: its wall time parts and the examples it trained on.
  void StepDone(absl::Duration compute, absl::Duration bn_sync,
                absl::Duration grad_sync, int64_t examples);

  enum BnPhase { kForward, kBackward };
  // A BN call of `layer` took `elapsed`. Each layer's series are resolved on
  // its first call and kept.
  void BnRoundTrip(const std::string& layer, BnPhase phase,
                   absl::Duration elapsed);

  // A client call is retried after an attempt that ended with `code`.
  void Retry(absl::StatusCode code);

 private:
  const std::function<absl::Time()> now_;
  metrics::Histogram* compute_;
  metrics::Histogram* bn_sync_;
  metrics::Histogram* grad_sync_;
  metrics::Counter* steps_;
  metrics::Counter* examples_;
  metrics::Gauge* step_;
  metrics::Gauge* images_per_second_;
  metrics::Family<metrics::Histogram>* round_trip_family_;
  metrics::Family<metrics::Counter>* retries_family_;
  std::array<std::atomic<metrics::Counter*>, 17> retries_{};
  // Per layer, by phase; null until that phase's first call.
  absl::Mutex layers_mu_;
  absl::flat_hash_map<std::string, std::array<metrics::Histogram*, 2>> layers_
      ABSL_GUARDED_BY(layers_mu_);
  // images_per_second's window.
  absl::Time window_start_;
  int64_t window_examples_ = 0;
};

}  // namespace bnps::worker

#endif  // BNPS_WORKER_WORKER_METRICS_H_
