// PsClient: what one worker needs of a job's shard servers, as an interface.
// The training loop and any user program (a binding to another framework,
// say) program against it; client/grpc_ps_client.h connects one to real servers over gRPC, and
// tests run trainers over an in-process implementation (tests/).
//
// A worker of a bulk-synchronous job (sync, recal, local) runs, per step s:
//   PullParametersInto(s, &params)       waits for the update of step s - 1
//     or StartPull(s, keys, &params), then Wait(key) before each layer's
//     forward pass, then Finish()
//   BnForward(layer, s, moments) ...     sync: per BN layer, in model order
//   BnBackward(layer, s, sums) ...       sync: per BN layer, in reverse order
//   PushGradients(s, samples, grads)     summed over this worker's samples
//     or StartPush(s, samples), then Add(part) per layer as the backward
//     pass finishes it, then Finish()
// Under async it brackets the step with StartStep(s) and FinishStep(s + 1),
// pulls the newest parameters (min_version 0), and its BnForward never waits.
// After training, BnRunning / BnLocalRunning / BnRecal + BnRecalFinish settle
// the running statistics (see worker/trainer.h).
//
// Keys (parameter names and BN layer names) have 1 to 256 bytes; each lives
// on one shard. Every push is applied at most once per (worker, step, key),
// and every BN call at most once per (worker, step, layer, phase), so a call
// that failed may be repeated.
//
// Errors: INVALID_ARGUMENT for bad arguments (checked before anything is
// sent) and for malformed answers; otherwise the status the servers gave,
// e.g. FAILED_PRECONDITION for a call the job's policy does not allow or a
// lost worker, DEADLINE_EXCEEDED for a barrier that other workers did not
// reach in time (the message names them); UNAVAILABLE when a server cannot
// be reached.
//
// Thread-safety: implementations are thread-safe.

#ifndef BNPS_CLIENT_PS_CLIENT_H_
#define BNPS_CLIENT_PS_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "proto/bnps.pb.h"

namespace bnps::client {

// A dense row-major float32 tensor: a parameter or a gradient.
struct Param {
  std::vector<int64_t> shape;
  std::vector<float> values;  // product(shape) elements
};

using Params = std::map<std::string, Param>;

// What a BN forward exchange returns.
struct BnForwardResult {
  // sync: the global batch's moments, to normalize with. async: the merge of
  // the admissible other workers' moments, to merge with the local ones
  // (policy/async_bn.h).
  bn::Moments merged;
  // The servers' running statistics after this step, when asked for.
  std::optional<bn::RunningStats> running;
  int contributors = 0;  // workers merged into `merged`
};

// One step's gradient push, handed over in parts: a backward pass gives each
// layer's gradients as soon as they are final and computes on while they
// travel. Every key of the step goes into exactly one part; the servers apply
// each key as if the whole step had come in one PushGradients (the same
// values, summed in the same way), so the results do not change by a bit.
//
// Errors: Add never fails; Finish returns the first error of any part (as
// PushGradients would give it), after every part handed over was answered --
// a part sent is never abandoned in flight, and a failed step may be pushed
// again, since the servers apply each (worker, step, key) at most once.
//
// Thread-safety: one thread calls Add and Finish.
class GradientPush {
 public:
  // Abandons the push (see Abandon) if neither Finish nor Abandon was called.
  virtual ~GradientPush() = default;
  // Hands over the gradients of keys not given before in this push. They are
  // referenced until Finish returns and must not change meanwhile. Returns
  // without waiting for the network.
  virtual void Add(std::shared_ptr<const Params> part) = 0;
  // Waits until every part is acknowledged or failed; the first error, or
  // OK. Call once, after the last Add.
  virtual absl::Status Finish() = 0;
  // Ends a push whose step failed before its last part: the parts not sent
  // yet are dropped, and the sends in flight are waited for (so nothing
  // still references the parts). Call instead of Finish.
  virtual void Abandon() = 0;
};

// One step's parameters, pulled key by key in an order the caller chose:
// each key can be used as soon as it is in, so a forward pass starts on the
// first layer's parameters while the rest still travel (and while the servers
// still apply the last updates of the layers after it).
//
// Errors: Wait(key) returns the error that kept `key` from coming (the
// servers' status for the call that was to bring it, as PullParametersInto
// would give it: DEADLINE_EXCEEDED naming the workers, FAILED_PRECONDITION
// for a lost worker, ABORTED when the job rolls back, ...), NOT_FOUND for a
// key not part of the pull. Finish returns the first error of any key, in
// the order asked, or OK once every key is in.
//
// Thread-safety: Wait may be called from several threads at once; Finish
// and the destructor from one, not concurrently with Wait.
class ParameterPull {
 public:
  // Stops what is still in flight and waits for it: once it returns,
  // nothing writes into the caller's buffers.
  virtual ~ParameterPull() = default;
  // Blocks until `key`'s values are in its entry (OK), or will not come.
  virtual absl::Status Wait(const std::string& key) = 0;
  // Blocks until every key is in or failed; the first error, or OK.
  virtual absl::Status Finish() = 0;
};

// For implementations of StartPull: INVALID_ARGUMENT for empty or repeated
// keys; OK otherwise.
absl::Status CheckPullKeys(const std::vector<std::string>& keys);
// Makes `*into` hold exactly `keys`, keeping the entries it has of them.
void KeepOnly(const std::vector<std::string>& keys, Params* into);

class PsClient {
 public:
  virtual ~PsClient() = default;

  // The job as the servers run it (policy, staleness, optimizer, timeouts;
  // its `shard` field is 0), this worker's id and the number of workers.
  virtual const proto::JobConfig& config() const = 0;
  virtual int worker() const = 0;
  virtual int num_workers() const = 0;

  // Initial values; the first initialization of a key wins, later ones are
  // ignored, so every worker may send the same.
  virtual absl::Status InitParameters(const Params& params) = 0;

  // The gradients of `step`, summed over `num_samples` samples. The copying
  // form copies the values; the shared form references them until it
  // returns, and they must not change meanwhile.
  virtual absl::Status PushGradients(int64_t step, int64_t num_samples,
                                     const Params& grads) = 0;
  virtual absl::Status PushGradients(
      int64_t step, int64_t num_samples,
      std::shared_ptr<const Params> grads) = 0;

  // The gradients of `step`, summed over `num_samples` samples, in parts
  // (GradientPush). The default collects the parts and sends them with one
  // PushGradients in Finish; GrpcPsClient sends them while the caller goes
  // on, once enough bytes are in (GrpcClientOptions::push_part_bytes).
  virtual std::unique_ptr<GradientPush> StartPush(int64_t step,
                                                  int64_t num_samples);

  // The keys of `*params` (every key of the job if it is empty), once each
  // has had at least `min_version` updates applied (0 never waits), written
  // into its entries (their buffers are reused). NOT_FOUND for a key no
  // shard has.
  virtual absl::Status PullParametersInto(int64_t min_version,
                                          Params* params) = 0;
  // PullParametersInto, key by key (ParameterPull): `keys` (distinct, at
  // least one) in this order, each at min_version. `*into` is made to hold
  // exactly `keys` before StartPull returns (entries already there keep
  // their buffers, which are reused); the caller reads an entry once Wait
  // for its key returned OK, and leaves `*into` alone otherwise until the
  // pull is destroyed. INVALID_ARGUMENT (from Wait and Finish) for empty or
  // repeated keys. The default pulls every key in StartPull, with one
  // PullParametersInto; GrpcPsClient streams the keys of every shard at
  // once, each as soon as its shard has it.
  virtual std::unique_ptr<ParameterPull> StartPull(
      int64_t min_version, const std::vector<std::string>& keys, Params* into);

  // Every parameter of the job, as above.
  absl::StatusOr<Params> PullParameters(int64_t min_version) {
    Params out;
    if (absl::Status s = PullParametersInto(min_version, &out); !s.ok()) {
      return s;
    }
    return out;
  }

  // BN exchanges. Forward: this worker's moments of `layer` at `step`
  // (sync: a barrier of every live worker); with `want_running`, the running
  // statistics too. Backward (sync only): this worker's backward sums;
  // returns the global sums.
  virtual absl::StatusOr<BnForwardResult> BnForward(
      const std::string& layer, int64_t step, const bn::Moments& local,
      bool want_running = false) = 0;
  virtual absl::StatusOr<bn::BackwardSums> BnBackward(
      const std::string& layer, int64_t step,
      const bn::BackwardSums& local) = 0;
  // Recalibration: the moments of this worker's batch `batch`; then, once
  // all its batches are in, the population statistics over every worker's
  // batches (a barrier).
  virtual absl::Status BnRecal(const std::string& layer, int64_t batch,
                               const bn::Moments& moments) = 0;
  virtual absl::StatusOr<bn::RunningStats> BnRecalFinish(
      const std::string& layer) = 0;
  // local: this worker's running statistics; returns the average over the
  // workers (a barrier).
  virtual absl::StatusOr<bn::RunningStats> BnLocalRunning(
      const std::string& layer, const bn::RunningStats& running) = 0;
  // The running statistics of `layer` as the servers hold them; NOT_FOUND
  // before they have any.
  virtual absl::StatusOr<bn::RunningStats> BnRunning(const std::string& layer,
                                                     int64_t channels) = 0;

  // Bounded-staleness clocks (async only). StartStep waits until this worker
  // may begin `step` and returns the slowest live worker's clock then;
  // FinishStep reports `completed` steps done.
  virtual absl::StatusOr<int64_t> StartStep(int64_t step) = 0;
  virtual absl::Status FinishStep(int64_t completed) = 0;

  // The workers the job counts as live, in increasing order, as last heard
  // from the servers (empty before anything was heard).
  virtual std::vector<int> LiveWorkers() const = 0;

  // Surviving restarts (docs/reliability.md). A call that fails with
  // ABORTED "... the job rolls back ..." (proto::IsRollback), or UNAVAILABLE
  // because a server is down, may be followed by Recover: it rolls the job
  // back to a step every server has a checkpoint of (all workers agree on
  // it) and returns that step, from which the worker trains again (the
  // servers hold that step's parameters). With `restarted`, the job rolls
  // back even if no server restarted: this process is a restart of a worker
  // that took part in the job (rejoining()), or it could not reach a server
  // within its retries while that server ran on (a network partition), so
  // the step it failed cannot be finished. FAILED_PRECONDITION when there is
  // nothing to roll back (or to); implementations without restarts:
  // UNIMPLEMENTED.
  virtual absl::StatusOr<int64_t> Recover(bool restarted) {
    (void)restarted;
    return absl::UnimplementedError("this client cannot roll a job back");
  }
  // True if this process runs a worker id that had taken part in the job
  // before it connected: a restart, which must Recover(true) first.
  virtual bool rejoining() const { return false; }

  // Elastic workers (proto/membership_history.h). The job's membership
  // (JobConfig.membership: which workers train from which step) as the
  // servers last said: at connection, then after each Recover or Join,
  // which may change it. Default: the config's.
  virtual google::protobuf::RepeatedPtrField<proto::MembershipSegment>
  membership() const {
    return config().membership();
  }
  // Asks a sync job to take this worker, whose id is at or above the job's
  // last count: rolls the job back as Recover does, to a step every server
  // has a checkpoint of, from which the job has at least worker() + 1
  // workers, and returns that step. Recover's errors; the servers'
  // FAILED_PRECONDITION ("resizing needs --policy=sync") under another
  // policy. Default (implementations without servers): UNIMPLEMENTED.
  virtual absl::StatusOr<int64_t> Join() {
    return absl::UnimplementedError("this client cannot resize a job");
  }
  // Asks a sync job to go on without this worker, the highest of the job's
  // count: rolls the job back as Recover does, to a step every server has a
  // checkpoint of, from which the job has worker() workers, and returns
  // that step (this worker trains no step from there). Recover's errors;
  // the servers' FAILED_PRECONDITION for another worker or policy. Default:
  // UNIMPLEMENTED.
  virtual absl::StatusOr<int64_t> LeaveEarly() {
    return absl::UnimplementedError("this client cannot resize a job");
  }

  // This worker finished the job: its last call, after training and after
  // the running statistics are settled. Once every worker of the job has
  // left, the job is complete: the servers write their final checkpoints
  // and (bnps_server without --keep_serving) exit. The servers' errors,
  // e.g. FAILED_PRECONDITION for a worker the job dropped; the default
  // (implementations without servers to tell) does nothing.
  virtual absl::Status Leave() { return absl::OkStatus(); }
};

}  // namespace bnps::client

#endif  // BNPS_CLIENT_PS_CLIENT_H_
