// Merges the BN traffic of a shard's layers under the job's policy.
//
//   sync    Forward and Backward are barriers per (layer, step): every live
//           worker contributes, then all get the same merge, computed in worker
//           order (bitwise independent of arrival order). Each completed forward
//           barrier updates the layer's running stats once, with the global
//           moments (unbiased variance), so they are identical for everyone.
//           With BN groups (Options::group_size) the barrier still waits for
//           every worker; each worker's answer is its group's merge, and the
//           running stats are still updated with the whole job's.
//   async   Forward never waits: the worker gets the merge of the other live
//           workers' latest moments whose step is >= step - staleness, and
//           normalizes with merge(own, that). Running stats are updated at each
//           arrival with merge(own, admissible others), with momentum
//           1 - (1 - m)^(1/W) so W arrivals weigh like one synchronous update.
//           With BN groups, "the other workers" are those of the worker's
//           group, while the running stats still merge every group's
//           admissible moments (in the exact mode, Options::bn_staleness, a
//           forward still waits for every live worker's moments of t - s).
//   recal   No BN traffic while training. Afterwards Recal files the moments of
//           every batch of every worker; RecalFinish is a barrier per layer that
//           merges them all, in (worker, batch) order, into population
//           statistics that become the running stats. (Recal works under every
//           policy: recalibrating after training is an option for all.)
//   local   No BN traffic while training; LocalRunning is a barrier per layer
//           that averages the workers' own running stats.
//
// Every barrier has a deadline: a barrier still missing workers then fails for
// all its waiters with DEADLINE_EXCEEDED naming the missing workers, and so
// does every later contribution to it. A removed worker (shrink) is not waited
// for; a failed worker (fail) makes barriers that need it fail with its status.
// Neither may contribute any more: the job dropped them.
// A repeated contribution of (worker, step, layer, phase) gets the same answer
// and is not merged twice.
//
// Admissible steps: a Forward or Backward of a step the job's clocks could not
// have allowed is refused (FAILED_PRECONDITION) without changing anything;
// accepted, a step of 10^15 would make every real step "from the past". With n
// the newest step of any Forward or Backward this aggregator accepted (-1
// before any):
//   sync    step <= max(n + 1, v), with v the newest parameter version on the
//           shard (Options::parameter_version): a worker reaches BN step c
//           after it pulled version c, or after step c - 1's barriers, which
//           needed every worker. Under async gradients there is no v (a
//           version per push is no step), and the barriers alone bound it.
//   async   step <= n + 1 + staleness: a worker begins step c only once every
//           live worker completed c - staleness steps, and so sent BN
//           statistics of step c - staleness - 1.
// (This assumes every step sends BN traffic to the shard, as the trainer's
// do: one that skips the shard's layers entirely for a step, on a shard
// without parameters, is refused.) Recalibration batches are not steps.
//
// Validated input: the statistics handed in must be well formed, as the
// decodes at the trust boundary make them (proto::DecodeMoments,
// DecodeSums, DecodeRunning: the BN transports decode before they call in).
// REQUIRES: Forward's and Recal's moments pass bn::ValidateMoments;
// Backward's sums are finite, sum_dy and sum_dy_xhat of one size;
// LocalRunning's stats are finite with var >= 0. The aggregator checks only
// how they relate to the layer (channel counts) and merges without scanning
// the values again.
//
// Errors: INVALID_ARGUMENT for a worker outside the job, a negative step or a
// channel count that differs from the layer's; FAILED_PRECONDITION for a phase
// the policy does not use, a removed or failed worker, or a step from the past
// or not admissible.
//
// Thread-safety: thread-safe. Callbacks run without the lock held, on the
// calling thread or on the thread whose call completed the barrier.

#ifndef BNPS_SERVER_BN_AGGREGATOR_H_
#define BNPS_SERVER_BN_AGGREGATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "util/byte_budget.h"
#include "policy/async_bn.h"
#include "server/bn_stale_window.h"
#include "policy/policy.h"

namespace bnps::server {

// What a checkpoint keeps of a BnAggregator: each layer's running stats and
// its newest finished barrier steps, the newest accepted step, and who
// contributed. Barriers in progress, async's latest moments and
// recalibration batches are not kept.
struct BnState {
  struct Layer {
    std::string name;
    int64_t channels = 0;
    std::optional<bn::RunningStats> running;
    int64_t newest_forward = -1;   // -1: no barrier finished
    int64_t newest_backward = -1;
  };
  std::vector<Layer> layers;  // in name order
  int64_t newest_step = -1;
  std::vector<bool> contributed;  // by worker
};

class BnAggregator {
 public:
  struct Options {
    policy::Policy policy = policy::Policy::kSync;
    // The worker ids the aggregator keeps records for, [0, num_workers).
    int num_workers = 1;
    int64_t staleness = 0;
    // Running-stats momentum, as PyTorch's. REQUIRES: in [0, 1].
    double momentum = 0.1;
    // sync BN with sync gradients: the newest parameter version on the
    // shard, for the admissible steps (above); none under async gradients.
    // Called without the aggregator's lock. Default: none (0).
    std::function<int64_t()> parameter_version;
    // How many workers (ids 0..n-1) the barriers of training step s wait
    // for, at most num_workers (a job resized while it runs,
    // proto/membership_history.h); the end-of-job barriers (recal-finish,
    // local-running) wait for the last step's. A contribution of a worker
    // outside them is refused. Must not call the aggregator. Default: none
    // (num_workers).
    std::function<int(int64_t)> workers_at;

    // BN groups (--bn_group_size), sync and async: the workers form groups
    // of this many consecutive ids (0..K-1, K..2K-1, ...), and a Forward or
    // Backward answer carries the merge of the answering worker's group
    // alone (in worker order), while the running stats follow the merge of
    // the whole job, exactly as without groups. 0: one group, the job.
    // REQUIRES: divides every worker count of the job
    // (policy::CheckBnGroups says so at start).
    int group_size = 0;
    // BN groups by host (--bn_group=host): the groups are whatever
    // SetGroups says, any partition of the workers; a forward or backward
    // barrier that completes before SetGroups fails (FAILED_PRECONDITION),
    // and an async answer before it merges no other worker's moments.
    // REQUIRES: group_size == 0. Default: false.
    bool group_by_host = false;
    // async BN's exact staleness (--bn_staleness, server/bn_stale_window.h):
    // a worker at step t gets the others' moments of step t - s exactly,
    // waiting for them up to the forward's deadline. -1: the bounded mode
    // (the others' latest within `staleness`, never waiting).
    int64_t bn_staleness = -1;
    // The recalibration moments one worker may have filed and not yet seen
    // merged (a layer's are kept until its RecalFinish, under every
    // policy), in bytes: a worker's Recal past it is
    // RESOURCE_EXHAUSTED, so that no worker's token grows the server's
    // memory without bound. A batch costs 16 bytes per channel and 96 per
    // layer: the default, 512 MiB, holds about 900 batches of a ResNet-50
    // (53 BN layers, 26,560 channels) per worker (recalibration takes a few
    // hundred).
    int64_t recal_bytes_per_worker = int64_t{512} << 20;
    // The server's one memory budget (ServerLimits::bn_memory_budget_bytes),
    // which the layers a worker names and the recalibration moments are
    // charged to as well, as lasting charges (ByteBudget::TryChargeLasting:
    // half of it stays for answers): a request past it is
    // RESOURCE_EXHAUSTED. Null: none.
    std::shared_ptr<util::ByteBudget> memory;
  };
  // What a layer a worker names is charged to Options::memory: a record
  // and its name, then, once its channel count is known, 32 bytes a
  // channel (its running statistics and latest merge), per worker under
  // async (each worker's latest moments).
  static constexpr int64_t kLayerRecordBytes = 512;

  struct Reply {
    bn::Moments moments;  // forward: what to merge with / normalize with
    bn::BackwardSums sums;
    std::optional<bn::RunningStats> running;
    int contributors = 0;
    // Barriers: how long computing the merge took (for metrics).
    absl::Duration merge_time;
    // async forward: step - step of each other worker's moments merged into
    // `moments` (for metrics).
    std::vector<int64_t> staleness;
    // With BN groups, a forward or backward barrier's answer: the group
    // whose merge it is (for metrics); -1 otherwise.
    int group = -1;
  };
  // Called once, maybe on another caller's thread, after the aggregator's
  // lock is released. The answer is shared by all the waiters of a barrier
  // (and kept for retries): it is not copied for each.
  using Done = std::function<void(const absl::StatusOr<Reply>&)>;

  explicit BnAggregator(Options options);
  ~BnAggregator();  // gives the recalibration moments' bytes back

  BnAggregator(const BnAggregator&) = delete;
  BnAggregator& operator=(const BnAggregator&) = delete;

  void Forward(int worker, int64_t step, const std::string& layer,
               bn::Moments local, absl::Time deadline, Done done);
  void Backward(int worker, int64_t step, const std::string& layer,
                bn::BackwardSums local, absl::Time deadline, Done done);
  // Files the moments of recalibration batch `batch`; answers at once.
  void Recal(int worker, int64_t batch, const std::string& layer,
             bn::Moments moments, Done done);
  void RecalFinish(int worker, const std::string& layer, absl::Time deadline,
                   Done done);
  void LocalRunning(int worker, const std::string& layer,
                    bn::RunningStats running, absl::Time deadline, Done done);

  // Under Options::group_by_host: each worker's BN group (0, 1, ...),
  // from then on. REQUIRES: one entry per worker of the job.
  void SetGroups(std::vector<int> group);

  void RemoveWorker(int worker);
  void FailWorker(int worker, absl::Status why);
  // Undoes RemoveWorker and FailWorker: a lost worker that never contributed
  // came back (server/shard.h says when).
  void RestoreWorker(int worker);
  void ExpireDeadlines(absl::Time now);

  // What the layers are charged to Options::memory, together.
  int64_t layer_bytes() const;
  // Whether a contribution of `worker` (any phase, recalibration included)
  // was accepted; false for an id outside the job.
  bool Contributed(int worker) const;
  // Whether any worker's was.
  bool AnyContributed() const;

  BnState Export() const;
  // Replaces the state with `state`; every barrier in progress fails with
  // `why` for its waiters. Which workers are live or failed stays.
  // INVALID_ARGUMENT, changing nothing, if `state` does not fit the job.
  absl::Status Import(const BnState& state, const absl::Status& why);

  // The layer's running stats, if any were computed.
  std::optional<bn::RunningStats> Running(const std::string& layer) const;
  int num_layers() const;

 private:
  enum class Phase { kForward, kBackward, kRecalFinish, kLocalRunning };
  using BarrierKey = std::tuple<std::string, Phase, int64_t>;

  struct Contribution {
    bn::Moments moments;
    bn::BackwardSums sums;
    bn::RunningStats running;
  };
  struct Barrier {
    std::vector<std::optional<Contribution>> by_worker;
    std::vector<std::pair<int, Done>> waiting;  // (worker, callback)
    absl::Time deadline = absl::InfiniteFuture();
    // Set once finished; shared with the waiters' callbacks.
    std::shared_ptr<const absl::StatusOr<Reply>> result;
    // With BN groups, a finished forward or backward barrier's answer for
    // each group (empty otherwise: every worker gets `result`).
    std::vector<std::shared_ptr<const absl::StatusOr<Reply>>> by_group;
  };
  struct Layer {
    int64_t channels = 0;
    // What the layer is charged to Options::memory (its name, and what its
    // channels take per worker); 0 for a layer from a checkpoint.
    int64_t charged = 0;
    std::optional<bn::RunningStats> running;
    std::vector<policy::LatestMoments> latest;         // async, by worker
    std::map<std::pair<int, int64_t>, bn::Moments> recal;  // (worker, batch)
    std::map<Phase, int64_t> newest_finished;          // barrier steps
    std::unique_ptr<StaleWindow> window;  // async with Options::bn_staleness
  };
  using Ready = std::vector<std::function<void()>>;

  // OK for a live worker of the job.
  absl::Status CheckWorker(int worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates the worker and the layer's channel count (0 = not checked);
  // records the layer and its channel count, charged to Options::memory
  // (RESOURCE_EXHAUSTED, recording nothing, when they do not fit).
  absl::Status Admit(int worker, const std::string& layer, int64_t channels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Options::parameter_version() under sync; 0 otherwise (unused there).
  int64_t ParameterVersion() const;
  // OK if a Forward or Backward of `step` is admissible (above), given the
  // parameters' `version`.
  absl::Status CheckStep(const char* phase, const std::string& layer,
                         int64_t step, int64_t version) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a contribution to a barrier and completes or fails it if it can.
  void Contribute(int worker, BarrierKey key, Contribution c, absl::Time deadline,
                  Done done, Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes `b` if every live worker contributed, fails it if a missing
  // worker failed; then hands its waiters to `ready`.
  void Evaluate(const BarrierKey& key, Barrier& b, Ready* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Reply> Finish(const BarrierKey& key, const Barrier& b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Resolve(const BarrierKey& key, Barrier& b, absl::StatusOr<Reply> result,
               Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answer of finished barrier `b` for `worker` (its group's, if any).
  std::shared_ptr<const absl::StatusOr<Reply>> ResultFor(const Barrier& b,
                                                         int worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With BN groups, fills b.by_group from the finished forward or backward
  // barrier `b` whose whole-job answer is `whole`.
  void SplitByGroup(const BarrierKey& key, Barrier& b, const Reply& whole)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Missing(const BarrierKey& key, const Barrier& b) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The workers barrier `key` waits for (Options::workers_at).
  int Members(const BarrierKey& key) const;
  void AsyncForward(int worker, int64_t step, Layer& layer, bn::Moments local,
                    Done done, Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same under Options::bn_staleness: answered once the others' moments
  // of step - bn_staleness are in.
  void ExactStaleForward(int worker, int64_t step, const std::string& name,
                         bn::Moments local, absl::Time deadline, Done done,
                         Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every layer's exact-staleness waits evaluated again (a worker left or
  // failed).
  void EvaluateWindows(Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running stats after an async answer whose merge of all is `all`.
  void MixAsync(Layer& layer, const bn::Moments& all)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int NumLive() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;

  mutable absl::Mutex mu_;
  std::map<std::string, Layer> layers_ ABSL_GUARDED_BY(mu_);
  std::map<BarrierKey, Barrier> barriers_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> live_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> contributed_ ABSL_GUARDED_BY(mu_);  // by worker
  // Gives every worker's recalibration bytes back (their moments are gone),
  // and the layers' charges.
  void ReleaseRecalBytes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges `bytes` for `what` to Options::memory: OK, or RESOURCE_EXHAUSTED.
  absl::Status ChargeMemory(int64_t bytes, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes of recalibration moments filed, by worker.
  std::vector<int64_t> recal_bytes_ ABSL_GUARDED_BY(mu_);
  // Each worker's BN group (policy::BnGroupOfWorkers, or SetGroups's);
  // empty: none. By host, before SetGroups: each worker alone.
  std::vector<int> group_ ABSL_GUARDED_BY(mu_);
  bool groups_set_ ABSL_GUARDED_BY(mu_) = false;  // by host: SetGroups ran
  // The newest step of an accepted Forward or Backward; -1 before any.
  int64_t newest_step_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_BN_AGGREGATOR_H_
