// What a host's BN aggregator (hostbn/aggregator.h) measures, registered in
// a metrics::Registry (metrics/registry.h); bnps_host_bn serves it over
// HTTP when asked (--metrics_port).
//
// Series (prefixed bnps_host_bn_; docs/observability.md has the table):
//   workers                    worker connections served now (hello taken)
//   hellos_total{result=accepted|refused}
//   shard_connections          connections to shards open now
//   frames_total{direction=from_workers|to_shards|from_shards|to_workers}
//                              BN frames relayed: from_workers / to_shards
//                              is the aggregation factor
//   shard_breaks_total         shard connections that broke or were refused,
//                              failing the requests waiting on them
//
// Thread-safety: thread-safe. The registry must outlive this.

#ifndef BNPS_HOSTBN_AGGREGATOR_METRICS_H_
#define BNPS_HOSTBN_AGGREGATOR_METRICS_H_

#include <cstdint>

#include "metrics/registry.h"

namespace bnps::hostbn {

class AggregatorMetrics {
 public:
  // `registry` is not owned.
  explicit AggregatorMetrics(metrics::Registry* registry);

  void HelloAccepted();
  void HelloRefused();
  void WorkerGone();
  void ShardConnected();
  void ShardGone();
  void ShardBroke();

  enum Direction { kFromWorkers, kToShards, kFromShards, kToWorkers };
  void Frames(Direction direction, int64_t n = 1);

 private:
  metrics::Gauge* workers_;
  metrics::Counter* accepted_;
  metrics::Counter* refused_;
  metrics::Gauge* shard_connections_;
  metrics::Counter* breaks_;
  metrics::Counter* frames_[4];
};

}  // namespace bnps::hostbn

#endif  // BNPS_HOSTBN_AGGREGATOR_METRICS_H_
