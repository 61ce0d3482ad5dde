#include "hostbn/aggregator_metrics.h"

namespace bnps::hostbn {

AggregatorMetrics::AggregatorMetrics(metrics::Registry* registry) {
  workers_ = registry
                 ->AddGauge("bnps_host_bn_workers",
                            "Worker connections served now (hello taken).")
                 ->WithLabels({});
  metrics::Family<metrics::Counter>* hellos = registry->AddCounter(
      "bnps_host_bn_hellos_total", "Workers' hellos, by result.", {"result"});
  accepted_ = hellos->WithLabels({"accepted"});
  refused_ = hellos->WithLabels({"refused"});
  shard_connections_ =
      registry
          ->AddGauge("bnps_host_bn_shard_connections",
                     "Connections to shards' BN listeners open now.")
          ->WithLabels({});
  breaks_ = registry
                ->AddCounter("bnps_host_bn_shard_breaks_total",
                             "Shard connections that broke or were refused, "
                             "failing the requests waiting on them.")
                ->WithLabels({});
  metrics::Family<metrics::Counter>* frames = registry->AddCounter(
      "bnps_host_bn_frames_total",
      "BN frames relayed, by direction (from_workers / to_shards is the "
      "aggregation factor).",
      {"direction"});
  frames_[kFromWorkers] = frames->WithLabels({"from_workers"});
  frames_[kToShards] = frames->WithLabels({"to_shards"});
  frames_[kFromShards] = frames->WithLabels({"from_shards"});
  frames_[kToWorkers] = frames->WithLabels({"to_workers"});
}

void AggregatorMetrics::HelloAccepted() {
  accepted_->Increment();
  workers_->Add(1);
}
void AggregatorMetrics::HelloRefused() { refused_->Increment(); }
void AggregatorMetrics::WorkerGone() { workers_->Add(-1); }
void AggregatorMetrics::ShardConnected() { shard_connections_->Add(1); }
void AggregatorMetrics::ShardGone() { shard_connections_->Add(-1); }
void AggregatorMetrics::ShardBroke() { breaks_->Increment(); }
void AggregatorMetrics::Frames(Direction direction, int64_t n) {
  if (n > 0) frames_[direction]->Increment(n);
}

}  // namespace bnps::hostbn
