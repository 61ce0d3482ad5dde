// What a shard server counts and measures, registered in a metrics::Registry
// (metrics/registry.h) and read by GetStatus. The service (shard_service.h)
// calls it; every observation is a few atomic operations on children
// resolved once (per BN layer: once per stream and layer, see ForLayer).
//
// Series (all prefixed bnps_server_; docs/observability.md has the table):
//   requests_total{method,code}            calls finished, by gRPC code
//   received_bytes_total{method}, sent_bytes_total{method}
//   pushes_total{result=applied|duplicate} tensors pushed
//   push_rejections_total{reason}          pushes refused, by status code
//   bn_rejections_total{reason}            BN messages refused
//   bn_barrier_wait_seconds{layer,phase}   a BN message's arrival to its answer
//   bn_merge_seconds{layer,phase}          computing a barrier's merge
//   bn_group_barrier_wait_seconds{group,phase}  with BN groups
//                                          (--bn_group_size, --bn_group):
//                                          the waits of the group's
//                                          workers' barrier messages
//   bn_staleness_steps                     async: age of merged moments
//   workers{state=live|lost|unregistered}, worker_step{worker},
//   parameter_version, checkpoint_age_seconds (once RecordCheckpoint ran)
//
// Layer names come from the workers: at most kMaxLayers distinct ones, of
// at most kMaxLayerNameBytes each, get series of their own; the rest share
// layer="(other)", so a client cannot grow the exposition without bound.
//
// Thread-safety: thread-safe. The registry and the shard must outlive this.

#ifndef BNPS_SERVER_SERVER_METRICS_H_
#define BNPS_SERVER_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "metrics/registry.h"
#include "proto/bnps.pb.h"
#include "server/shard.h"
#include "util/byte_budget.h"

namespace bnps::server {

class ServerMetrics {
 public:
  enum Method {
    kRegister, kHeartbeat, kInitParameters, kPushGradients, kPullParameters,
    kBnSync, kStartStep, kFinishStep, kGetStatus, kRollback, kGetDigest,
    kLeave, kReadState, kSession, kNumMethods
  };
  // The phases of proto::BnPhase, in its order.
  enum BnPhase {
    kForward, kBackward, kRecal, kRecalFinish, kLocalRunning, kRunning,
    kNumBnPhases
  };
  static constexpr int kMaxLayers = 1024;
  static constexpr size_t kMaxLayerNameBytes = 256;
  static const char* MethodName(Method m);
  static const char* PhaseName(BnPhase p);

  // Neither pointer is owned. Registers the families in `registry` and a
  // collector that reads the shard's membership and store at each scrape.
  ServerMetrics(metrics::Registry* registry, Shard* shard);

  // A call of `m` ended with `code`.
  void Request(Method m, absl::StatusCode code);
  void Received(Method m, int64_t bytes) { received_[m]->Increment(bytes); }
  void Sent(Method m, int64_t bytes) { sent_[m]->Increment(bytes); }

  void PushApplied(int worker);
  void PushDuplicate() { duplicate_->Increment(); }
  void PushRejected(absl::StatusCode code);
  void BnRejected(absl::StatusCode code);
  // The newest step a message of `worker` named (pushes, BN).
  void WorkerAt(int worker, int64_t step);
  void Staleness(int64_t steps) { staleness_->Observe(static_cast<double>(steps)); }
  // With BN groups, a forward or backward barrier message whose answer was
  // group `group`'s merge (BnAggregator::Reply::group) waited `wait` from
  // arrival to answer. Nothing without groups, for other phases, or for a
  // group outside [0, num_workers) (-1: an answer of no group).
  void GroupWait(int group, BnPhase phase, absl::Duration wait);

  // One BN layer's series; resolved once by ForLayer, then lock-free except
  // for the slowest-wait summary of the status view (a short lock per
  // message, uncontended across layers).
  class Layer {
   public:
    // A message of `phase` for `step` waited `wait` from arrival to answer;
    // the barrier's merge took `merge` (zero where none was computed).
    void Observe(BnPhase phase, int64_t step, absl::Duration wait,
                 absl::Duration merge);

   private:
    friend class ServerMetrics;
    Layer(const ServerMetrics* owner, std::string label);
    struct Phase {
      std::atomic<metrics::Histogram*> wait{nullptr};
      std::atomic<metrics::Histogram*> merge{nullptr};
    };
    // The phase's children, made on first use (most layers see two phases).
    Phase& Resolve(BnPhase phase);

    const ServerMetrics* const owner_;
    const std::string label_;
    std::array<Phase, kNumBnPhases> phases_;
    mutable absl::Mutex mu_;
    // Per phase: the newest step seen and its slowest wait so far.
    std::array<int64_t, kNumBnPhases> step_ ABSL_GUARDED_BY(mu_);
    std::array<double, kNumBnPhases> slowest_ ABSL_GUARDED_BY(mu_);
  };
  // The layer's series, created on first use. Keep the pointer.
  Layer* ForLayer(const std::string& layer);

  // A stream's own map from layer names to their series, so that a BN
  // message costs one lookup in it rather than in ForLayer's shared map.
  // The names come from the wire: it keeps at most kMaxLayers of them (past
  // that, Get asks ForLayer each time), so a stream that names ever new
  // layers holds no more than that. Used from one thread (the stream's read
  // path).
  // Each name kept is charged to `budget` (the server's memory budget;
  // null: none), kEntryBytes plus its length, until the cache goes; a name
  // that does not fit it (a lasting charge: ByteBudget::TryChargeLasting)
  // or the cache's own kMaxBytes is not kept.
  class LayerCache {
   public:
    static constexpr int64_t kEntryBytes = 64;
    static constexpr int64_t kMaxBytes = 256 << 10;
    explicit LayerCache(ServerMetrics* metrics,
                        util::ByteBudget* budget = nullptr)
        : metrics_(metrics), budget_(budget) {}
    ~LayerCache() {
      if (budget_ != nullptr) budget_->Release(charged_);
    }
    LayerCache(const LayerCache&) = delete;
    LayerCache& operator=(const LayerCache&) = delete;
    Layer* Get(const std::string& layer);
    size_t size() const { return layers_.size(); }  // names kept
    int64_t charged() const { return charged_; }

   private:
    ServerMetrics* const metrics_;
    util::ByteBudget* const budget_;  // not owned; null: none
    int64_t charged_ = 0;
    absl::flat_hash_map<std::string, Layer*> layers_;
  };

  // Hook for checkpoints: a checkpoint of this shard was written at `when`.
  // From then on checkpoint_age_seconds is exposed (now - when).
  void RecordCheckpoint(absl::Time when);

  // For GetStatus.
  int64_t worker_step(int worker) const;    // -1 before any message
  int64_t worker_pushes(int worker) const;  // tensors applied
  struct LayerSummary {
    std::string layer;
    BnPhase phase;
    int64_t messages = 0;
    double mean_wait_seconds = 0;
    int64_t step = -1;               // newest step seen
    double slowest_wait_seconds = 0;  // in that step
  };
  // Forward and backward phases with traffic, by layer.
  std::vector<LayerSummary> Layers() const;
  // Sets the workers' step and pushes (`status` lists the workers already)
  // and adds the BN layers' summaries.
  void FillStatus(proto::StatusResponse* status) const;

 private:
  void Collect();
  // With BN groups in `o`, the family of the group wait series (GroupWait).
  void AddGroupWaits(const ShardOptions& o);

  metrics::Registry* const registry_;
  Shard* const shard_;
  metrics::Family<metrics::Counter>* requests_family_;
  metrics::Family<metrics::Counter>* push_rejected_family_;
  metrics::Family<metrics::Counter>* bn_rejected_family_;
  metrics::Family<metrics::Histogram>* wait_family_;
  metrics::Family<metrics::Histogram>* merge_family_;
  // Children made on first use (codes are many; most never happen).
  std::array<std::array<std::atomic<metrics::Counter*>, 17>, kNumMethods>
      requests_{};
  std::array<std::atomic<metrics::Counter*>, 17> push_rejected_{};
  std::array<std::atomic<metrics::Counter*>, 17> bn_rejected_{};
  std::array<metrics::Counter*, kNumMethods> received_;
  std::array<metrics::Counter*, kNumMethods> sent_;
  metrics::Counter* applied_;
  metrics::Counter* duplicate_;
  metrics::Histogram* staleness_;
  // With BN groups: the family and, by 2 * group + (backward), its
  // children, made on first use. Null without groups.
  metrics::Family<metrics::Histogram>* group_wait_family_ = nullptr;
  std::unique_ptr<std::atomic<metrics::Histogram*>[]> group_wait_;
  metrics::Gauge* live_;
  metrics::Gauge* lost_;
  metrics::Gauge* unregistered_;
  metrics::Gauge* version_;
  metrics::Family<metrics::Gauge>* checkpoint_age_family_;
  std::vector<metrics::Gauge*> worker_step_gauges_;
  std::unique_ptr<std::atomic<int64_t>[]> worker_steps_;
  std::unique_ptr<std::atomic<int64_t>[]> worker_pushes_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Layer>> layers_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> checkpoint_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_SERVER_METRICS_H_
