// WorkerBn: the worker side of a job's BN policy, written once for every
// frontend -- the C++ worker's BN layers (worker/server_bn_exchange.h) and
// bnps.torch (through the C ABI, python/native/bnps_c.h). A frontend moves
// tensors; what to normalize with, whether the backward pass exchanges its
// sums, how the running statistics follow, and which momentum a layer may
// use are decided here:
//
//   policy  forward exchange       normalize with              backward  running statistics
//   sync    BnForward (a barrier)  the global batch's moments  global    from what it normalized with
//   async   BnForward (no wait)    merge(own, others')         local     the servers' (want_running)
//   local   none                   its own moments             local     from its own moments
//   recal   none                   its own moments             local     from its own moments
//
// After training, SettleRunning says how the running statistics become the
// job's: nothing (sync), the workers' average (local), the servers' (async);
// recal recalibrates instead (FAILED_PRECONDITION).
//
// A training-mode forward pass of a layer is one sequence, which Forward
// runs for every frontend (the C++ worker, the C ABI's layer steps and its
// stream-ordered exchanges):
//   CheckLayer; BnForwardPlan plan = PlanForward(tracks_running);
//   std::optional<BnForwardResult> answer;
//   if (plan.exchange) answer = client->BnForward(layer, step, local,
//                                                 plan.want_running);
//   StatusOr<BnForwardOutcome> out = Resolve(local, answer);
//   ApplyRunning(*out, momentum, batches_tracked, running);
//
// Thread-safety: immutable after construction; every method is const.

#ifndef BNPS_CLIENT_WORKER_BN_H_
#define BNPS_CLIENT_WORKER_BN_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bn/moments.h"
#include "client/ps_client.h"
#include "policy/policy.h"
#include "proto/bnps.pb.h"

namespace bnps::client {

// What a training-mode forward pass sends.
struct BnForwardPlan {
  bool exchange = false;      // call PsClient::BnForward
  bool want_running = false;  // ask it for the servers' running statistics
};

// How a layer's running statistics follow a training-mode forward pass.
enum class RunningUpdate {
  kNone,         // leave them (the layer tracks none, or no answer had them)
  kFromBatch,    // UpdateRunning with the moments it normalizes with
  kFromServers,  // take BnForwardOutcome::servers_running
};

struct BnForwardOutcome {
  bn::Moments normalize;         // what to normalize with; its count is the
                                 // backward pass's
  bool global_backward = false;  // the backward pass exchanges its sums
  RunningUpdate running = RunningUpdate::kNone;
  std::optional<bn::RunningStats> servers_running;  // with kFromServers
};

// A layer's running statistics, which a forward pass updates in place.
struct LayerRunning {
  std::optional<double> momentum;  // nullopt: torch's cumulative average
  int64_t* batches_tracked;        // not owned
  bn::RunningStats* stats;         // not owned
};

// How running statistics become the job's after training.
enum class RunningSettle {
  kNothing,         // they are the job's already (sync)
  kWorkersAverage,  // PsClient::BnLocalRunning (local)
  kServers,         // PsClient::BnRunning (async)
};

class WorkerBn {
 public:
  // `job_bn_momentum`: the servers' running-statistics momentum
  // (JobConfig::bn_momentum).
  WorkerBn(policy::Policy policy, double job_bn_momentum)
      : policy_(policy), job_bn_momentum_(job_bn_momentum) {}
  // From the job's config. INVALID_ARGUMENT for an unknown policy.
  static absl::StatusOr<WorkerBn> FromConfig(const proto::JobConfig& config);

  policy::Policy policy() const { return policy_; }

  // OK if a layer with this momentum (nullopt: torch's cumulative average)
  // can train under the policy. INVALID_ARGUMENT naming `layer` and both
  // values under async when the layer tracks running statistics with
  // another momentum than the job's: the servers keep them, with theirs.
  absl::Status CheckLayer(const std::string& layer, bool tracks_running,
                          std::optional<double> momentum) const;

  BnForwardPlan PlanForward(bool tracks_running) const;

  // The outcome of a forward pass whose local moments are `local`, given
  // the BnForward answer when PlanForward said to exchange (nullopt
  // otherwise). INVALID_ARGUMENT for an answer that the plan did not call
  // for or that is missing; errors of the merge (channel counts that
  // differ) as bn::MergeMoments.
  absl::StatusOr<BnForwardOutcome> Resolve(
      const bn::Moments& local,
      const std::optional<BnForwardResult>& answer) const;

  // The whole training-mode forward pass of `layer` at `step` (above):
  // CheckLayer, PlanForward, BnForward through the client `get_client`
  // returns (called only when the plan exchanges), Resolve, and, when the
  // layer tracks running statistics (`running`), ApplyRunning to them.
  // *exchanged (if given) is set once BnForward succeeded: the step is used
  // on the servers even if a later part fails. Errors of the client as it
  // gives them; of CheckLayer, Resolve and ApplyRunning as they say.
  absl::StatusOr<BnForwardOutcome> Forward(
      const std::function<absl::StatusOr<PsClient*>()>& get_client,
      const std::string& layer, int64_t step, const bn::Moments& local,
      const std::optional<LayerRunning>& running = std::nullopt,
      bool* exchanged = nullptr) const;

  // Whether the backward pass exchanges its two sums (sync).
  bool GlobalBackward() const { return policy::GlobalBnBackward(policy_); }

  // How to settle the running statistics after training; FAILED_PRECONDITION
  // under recal, which recalibrates instead.
  absl::StatusOr<RunningSettle> SettleRunning() const;

 private:
  policy::Policy policy_;
  double job_bn_momentum_;
};

// running = (1 - m) running + m batch (unbiased variance for var), as torch
// updates a BatchNorm's buffers: increments *batches_tracked, and m is
// `momentum`, or 1 / *batches_tracked when it is nullopt (the cumulative
// average). A batch with count 0 changes nothing. INVALID_ARGUMENT for a
// batch of one sample per channel (no unbiased variance; torch refuses it
// too), invalid moments or channel counts that differ.
absl::Status UpdateRunning(const bn::Moments& batch,
                           std::optional<double> momentum,
                           int64_t* batches_tracked, bn::RunningStats* running);

// A layer's running statistics after a forward pass with `outcome`, as its
// RunningUpdate says: kFromBatch is UpdateRunning with outcome.normalize,
// kFromServers copies outcome.servers_running and increments
// *batches_tracked (as torch counts a step), kNone changes nothing. Errors
// of UpdateRunning; INVALID_ARGUMENT if the servers' statistics are missing
// or have another channel count than `running`.
absl::Status ApplyRunning(const BnForwardOutcome& outcome,
                          std::optional<double> momentum,
                          int64_t* batches_tracked, bn::RunningStats* running);

}  // namespace bnps::client

#endif  // BNPS_CLIENT_WORKER_BN_H_
