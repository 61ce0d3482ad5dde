// The training loop of one worker: data -> model -> servers, under the job's
// policy, then the end-of-training BN statistics and the test accuracy.
//
// A step (global step s, counted across epochs):
//   async only   StartStep(s): wait while the bound would break
//   pull         the parameters: bulk-synchronous policies wait for version s
//                (the update of step s - 1), before the forward pass or
//                layer by layer during it (options.layer_pull); async
//                takes the newest
//   forward      BN layers through a ServerBnExchange: sync merges every layer on the
//                servers (a barrier), async merges with the others' recent
//                moments (never waits), local and recal stay local
//   loss, backward (sync: the two global BN sums per layer)
//   push         the gradient sums and the sample count of step s: by
//                default each layer's as soon as the backward pass has them,
//                overlapping the rest of the pass (options.overlap)
//   async only   FinishStep(s + 1)
// Every worker runs the same number of steps (empty batches included), which
// the bulk-synchronous barriers need; in a sync job resized while it runs
// (JobConfig.membership), a worker runs the steps it is one of (ids
// 0..W(s)-1), and each step's batch follows the elastic data rule
// (worker/data/elastic_shard.h), so a resize at step N trains as a restart at
// N with the new count does. A worker whose id no step to come counts asks
// the job to take it (client->Join: the job rolls back to a checkpoint step
// and grows from there); every worker re-reads the membership after a
// rollback.
//
// While training, each BN layer updates its own running statistics from the
// moments it normalized with; under sync that is exactly what the servers do
// (bnps_worker builds the model with the servers' --bn_momentum). Before every
// evaluation, sync and async read the servers' (BnRunning), which are
// authoritative. After the last step the running statistics are settled by
// policy: sync and async take the servers' final ones; local averages
// the workers' own (BnLocalRunning); recal recomputes population statistics
// over every worker's training shard (Recalibrate, mode precise or exact).
// Any policy may also recalibrate afterwards (options.recalibrate), which gives
// a second test accuracy. Recalibration and BnLocalRunning are barriers: every
// worker of the job must run them.
//
// Replicas (co-located aggregation, options.replicas): the process may drive
// several copies of the model (one per GPU, or per group of CPU cores) and
// still be ONE worker to the servers. Each step's batch is split into
// contiguous slices, one per replica, run on one thread each; their BN
// contributions are combined on the host in replica order
// (worker/host_bn_group.h) and cross to the servers once per layer, and their
// gradients are summed in replica order and pushed once. A worker with K
// replicas computes what one replica would on the whole batch, to float
// rounding. Evaluation and recalibration use the first model.
//
// Restarts (docs/reliability.md): a step that fails because the job rolls
// back (a server restarted from its checkpoint; proto::IsRollback) or a
// server is unreachable makes the trainer call client->Recover and go on
// from the step it returns, with that step's batch (the sampler is
// deterministic in (seed, epoch, step)); at most kMaxRecoveries times. A
// worker that rejoins (client->rejoining(), a restarted process) recovers
// before its first step. Under sync and async the servers' running stats
// are final; under local, the workers' own running stats are not rolled
// back.
//
// Errors: the first failure of the client, the model or the data ends the run
// with that status, annotated with the step.
//
// Thread-safety: a Trainer is used from one thread.

#ifndef BNPS_WORKER_TRAINER_H_
#define BNPS_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/data/batcher.h"
#include "worker/data/dataset.h"
#include "nn/model.h"
#include "worker/worker_metrics.h"
#include "client/ps_client.h"
#include "policy/policy.h"
#include "proto/membership_history.h"
#include "proto/bnps.pb.h"

namespace bnps::worker {

class ServerBnExchange;  // worker/server_bn_exchange.h
class HostBnGroup;       // worker/host_bn_group.h
class ReplicaThreads;    // worker/replica_threads.h
class LayerPull;         // worker/layer_pull.h

enum class RecalMode {
  // One pass, all layers at once; upstream layers normalize with batch stats.
  kPrecise,
  // Layer by layer; upstream layers already use their population stats, so
  // the statistics match what inference sees.
  kExact,
};

// "precise" or "exact"; INVALID_ARGUMENT otherwise.
absl::StatusOr<RecalMode> ParseRecalMode(const std::string& name);
std::string RecalModeName(RecalMode mode);

struct TrainerOptions {
  // Per-worker examples per step, >= 1. Default: 32.
  int64_t batch_size = 32;
  // Passes over the training data, >= 1. Default: 1.
  int64_t epochs = 1;
  // Stop after this many steps in all (0: run every epoch); for tests and
  // short runs. Must be the same on every worker. Default: 0.
  int64_t max_steps = 0;
  // A sync job's highest worker leaves it early once it reached this step
  // (client->LeaveEarly: the job goes on without it from a checkpoint step
  // at or before this one); 0: never. Default: 0.
  int64_t leave_at_step = 0;
  // Steps numbered below this are left out of the report's seconds_* split
  // and images_per_second (a warm-up: first touches of the model,
  // connections, caches); they still train. Default: 0.
  int64_t timing_warmup_steps = 0;
  // Seed of the initial parameters and of the shuffle; the same on every
  // worker. Default: 1.
  uint64_t seed = 1;
  // Shuffle the training data every epoch (see worker/data/batcher.h); false
  // reads each worker's shard in order. Default: true.
  bool shuffle = true;
  // Use only the first this-many training / test examples (0: all).
  int64_t train_examples = 0;
  int64_t test_examples = 0;
  // How the recal policy (and options.recalibrate) recomputes statistics.
  // Default: precise.
  RecalMode recal_mode = RecalMode::kPrecise;
  // Also recalibrate under sync, async and local, after evaluating with the
  // policy's own statistics. Every worker must agree. Default: false.
  bool recalibrate = false;
  // Recalibrate over the first this-many training examples (split among the
  // workers like the training data); 0: all of train_examples. Default: 0.
  int64_t recal_examples = 0;
  // Evaluate on the test set at the end (and after each epoch when
  // eval_every_epoch). Default: true.
  bool evaluate = true;
  bool eval_every_epoch = false;
  // Called about every progress_interval with the latest figures, and once at
  // the end of each epoch. Default: none.
  std::function<void(const struct Progress&)> on_progress;
  absl::Duration progress_interval = absl::Seconds(2);
  // More replicas of the model (not owned; must outlive the Trainer), built
  // with the same options on backends of their own, each listed once;
  // empty: the model alone. batch_size stays the worker's batch, split
  // among the models. With replicas the gradients are pushed after the
  // backward pass (overlap and overlap_bn do not apply). See the file
  // comment. Default: none.
  std::vector<nn::Model*> replicas;
  // Called first on each extra replica's thread with its index (1, 2, ...),
  // e.g. to set that thread's OpenMP thread count. Default: none.
  std::function<void(int)> on_replica_thread;
  // Push each layer's gradients as soon as the backward pass has them
  // (client->StartPush), so the push overlaps the rest of the pass; false
  // pushes all of them after it (PushGradients). The results are the same
  // bit for bit. Default: true.
  bool overlap = true;
  // Bulk-synchronous policies: pull each step's parameters layer by layer
  // (worker/layer_pull.h): the forward pass waits for a layer's parameters
  // just before the layer, so it starts on the first layer while the rest
  // are still on their way (and still being updated on the servers); false
  // pulls all of them before the pass. Async always pulls them all. The
  // results are the same bit for bit. Default: false until measured on a
  // machine with cores to spare: here (2 cores shared) it gained nothing at
  // 1 worker, where the update is in before the step starts, and cost up to
  // 0.8 ms a step at 2 workers, where waking the pull's thread waits for a
  // core (docs/worker.md).
  bool layer_pull = false;
  // Compute a convolution's weight gradient while the BN before it exchanges
  // its backward sums (nn::Model::SetBackwardOverlap; the exchange runs on a
  // thread of its own). The results are the same bit for bit. Default: false
  // until measured on a machine with cores to spare: here (2 cores shared)
  // the hand-over to the exchange's thread could cost more than it hides.
  bool overlap_bn = false;
  // Where steps and BN round trips are measured (not owned; must outlive
  // the Trainer). Default: null, nothing measured.
  WorkerMetrics* metrics = nullptr;
};

struct Progress {
  int64_t step = 0;         // steps done
  int64_t total_steps = 0;  // steps of the run
  int64_t epoch = 0;        // 0-based epoch of the last step
  double loss = 0;          // mean loss per example since the last report
  double accuracy = 0;      // training accuracy since the last report
  double images_per_second = 0;
  int64_t staleness = 0;    // async: step - slowest worker's clock; else 0
  double seconds = 0;       // since training started
};

// One point of the training curve.
// Recorded every max(1, total_steps / 50) steps.
struct HistoryPoint {
  int64_t step = 0;
  double seconds = 0;
  double loss = 0;  // mean per example over the interval
  double accuracy = 0;
};

struct EvalPoint {
  int64_t epoch = 0;  // epochs done
  double seconds = 0;
  double test_accuracy = 0;
};

struct TrainReport {
  std::string policy;
  int worker = 0;
  int num_workers = 1;
  int64_t steps = 0;
  int64_t epochs = 0;
  int64_t examples = 0;  // trained on by this worker
  double train_loss_first = 0;  // mean over the first reporting interval
  double train_loss_last = 0;   // mean over the last
  std::optional<double> test_accuracy;        // with the policy's statistics
  std::optional<double> test_accuracy_recal;  // after recalibrating
  double images_per_second = 0;  // this worker's
  int64_t max_staleness = 0;  // async: the most step - slowest clock seen
  // Wall time of the steps, split: compute (data, model), BN sync (waiting
  // for and exchanging BN statistics), gradient sync (pull, push, clocks).
  double seconds_total = 0;
  double seconds_compute = 0;
  double seconds_bn_sync = 0;
  double seconds_grad_sync = 0;
  double seconds_finish = 0;  // running-stats settlement and recalibration
  // Steps the seconds_* split covers: steps less the options'
  // timing_warmup_steps (all of them when the run was shorter).
  int64_t timed_steps = 0;
  int64_t timed_examples = 0;  // trained on in those steps
  std::vector<HistoryPoint> history;
  std::vector<EvalPoint> evals;
};

// The report as one JSON object (the launcher and the policy comparison read
// it).
std::string ReportJson(const TrainReport& report);

class Trainer {
 public:
  // None of the pointers is owned; all must outlive the Trainer. `test` may
  // be null when options.evaluate is false.
  Trainer(client::PsClient* client, nn::Model* model, const Dataset* train,
          const Dataset* test, TrainerOptions options);

  absl::StatusOr<TrainReport> Run();

  // Test accuracy with the model's current parameters and running stats.
  absl::StatusOr<double> Evaluate();

 private:
  static constexpr int64_t kMaxRecoveries = 100;
  struct StepFigures {
    double loss_sum = 0;
    int64_t correct = 0;
    int64_t staleness = 0;
    absl::Duration grad_time;
    absl::Duration bn_time;
  };
  // One training step (the file comment's list).
  // Where a run is: its steps per epoch and in all, the next step to train,
  // the rollbacks so far, when training began.
  struct RunState {
    int64_t per_epoch = 0;
    int64_t total = 0;
    int64_t step = 0;
    int64_t recoveries = 0;
    absl::Time start;
    // Which workers train at each step (client->membership()).
    proto::MembershipHistory members{1};
  };
  // Run's parts: the options' checks; joining the job (initial parameters,
  // or a rollback for a worker that rejoins or finds a server restarted);
  // the steps, each retried from a checkpoint the job rolls back to; the
  // report's totals, the settled running statistics, evaluation and
  // recalibration.
  absl::Status CheckOptions() const;
  absl::Status JoinJob(RunState* run);
  // run->members from the client's membership (which a Recover or Join may
  // have changed).
  absl::Status RefreshMembers(RunState* run) const;
  absl::Status TrainSteps(Batcher* batcher, ServerBnExchange* sync,
                          RunState* run, TrainReport* report);
  // TrainSteps' parts. LeaveEarly: the planned leave at
  // options_.leave_at_step (run->step jumps to the step the job goes on
  // from). AwaitFirstStep: the wait for the first step this worker trains
  // after sitting some out. RecoverFromStep: after step run->step failed
  // with `s`, OK once the job rolled back (run->step is where to go on),
  // else the error to stop with. CountStep: a step's figures into the
  // report's totals and the metrics. ReportProgress: one on_progress call
  // over *prog, which it then clears. EvaluateEpoch: the evaluation after
  // an epoch (eval_every_epoch).
  struct Window {  // figures since the last history point or progress report
    double loss = 0;
    int64_t correct = 0;
    int64_t n = 0;
  };
  absl::Status LeaveEarly(RunState* run);
  absl::Status AwaitFirstStep(int64_t step);
  absl::Status RecoverFromStep(const absl::Status& s, RunState* run);
  void CountStep(int64_t step, const StepFigures& f, int64_t n,
                 absl::Duration took, TrainReport* report) const;
  void ReportProgress(const RunState& run, int64_t epoch, int64_t staleness,
                      Window* prog, double* prog_start) const;
  absl::Status EvaluateEpoch(const RunState& run, int64_t epoch,
                             TrainReport* report);
  absl::Status FinishRun(const RunState& run, TrainReport* report);

  absl::Status TrainStep(int64_t step, const Batch& batch,
                         ServerBnExchange* sync, StepFigures* f);
  // With replicas: forward, loss and backward of `batch` on every model (its
  // slice each); the gradients summed in replica order.
  absl::StatusOr<nn::HostTensors> Compute(int64_t step, const Batch& batch,
                                          StepFigures* f,
                                          absl::Duration* pull_wait);
  // Forward, loss, backward and push of `step` (the models' part of
  // TrainStep); adds the first model's waits for the layer pull to
  // *pull_wait.
  absl::Status ComputeAndPush(int64_t step, const Batch& batch,
                              StepFigures* f, absl::Duration* pull_wait);
  // The hook that feeds model `m` its parameters layer by layer; empty
  // without a layer pull.
  nn::Model::ParametersNeeded PullHook(nn::Model* m, absl::Duration* waited);
  // The push of `step`'s gradients after the backward pass.
  absl::Status Push(int64_t step, int64_t n, nn::HostTensors grads,
                    StepFigures* f);
  // Backward pass and push of `step` over `n` samples: all gradients after
  // the pass, or each layer's as the pass finishes it (options_.overlap).
  absl::Status BackwardThenPush(int64_t step, int64_t n, StepFigures* f);
  absl::Status BackwardAndPush(int64_t step, int64_t n, StepFigures* f);
  // This worker's shard of the training data, its epochs cut for the
  // membership's first count.
  BatcherOptions ShardOptions(const proto::MembershipHistory& members) const;
  absl::Status PullInto(int64_t min_version);
  absl::Status SettleRunningStats(int64_t steps);
  // Sync and async: every BN layer takes the servers' running stats. After
  // zero steps the servers have none and the layers keep their own.
  absl::Status PullRunningStats(int64_t steps);
  absl::Status Recalibrate();

  client::PsClient* const client_;
  nn::Model* const model_;
  const Dataset* const train_;
  const Dataset* const test_;
  const TrainerOptions options_;
  const std::vector<nn::Model*> models_;  // model_, then the replicas
  // With replicas, while Run trains: the host's BN group and the threads
  // that run replicas 1, 2, ... (created once per Run).
  HostBnGroup* group_ = nullptr;
  ReplicaThreads* replica_threads_ = nullptr;
  // Bulk-synchronous with options.layer_pull, while Run trains: the step's
  // layer-by-layer pull; null: the whole pull before the pass.
  LayerPull* layer_pull_ = nullptr;
  // The servers' BN policy and gradient mode (sync if they report one it
  // does not know: Run then fails).
  const policy::JobPolicy job_policy_;
  const policy::Policy policy_;  // job_policy_.bn
  const bool bulk_synchronous_;  // job_policy_.gradients is sync
};

}  // namespace bnps::worker

#endif  // BNPS_WORKER_TRAINER_H_
