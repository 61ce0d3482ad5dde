// One shard server's state and logic, without any network: the parameters it
// owns, BN aggregation, membership, and (on shard 0 under the async policy) the
// workers' clocks. The gRPC service (server/shard_service.h) translates
// requests into calls on these.
//
// A ticker thread calls Tick every `tick` to turn silent workers into lost ones
// (fail: steps that need them fail with FAILED_PRECONDITION; shrink: they are
// dropped and steps complete with the others) and to expire deadlines. Tests
// may run without the ticker and call Tick with a time of their choosing.
// Either way the job has dropped a lost worker: its pushes, BN contributions
// and clock updates are refused (FAILED_PRECONDITION), so it changes nothing.
//
// Workers join through Register. A lost worker may register again (a
// relaunch, with a new incarnation) only if it never took part in the job on
// this shard, which Register defines exactly; otherwise it stays lost.
//
// Under --on_worker_loss=wait a lost worker is only logged: steps that need
// it wait for it up to their deadlines, and a process that registers with
// its id (a restart, with another incarnation) takes its place at once.
//
// Checkpoints (with a checkpoint_dir): at every checkpoint_every-th step
// boundary of the store (store/parameter_store.h; under the bulk-synchronous
// policies one all shards pass) the shard copies its state -- parameters,
// optimizer state, exactly-once records, BN running statistics, membership,
// clocks, the job's config and generation -- and a writer thread saves it
// (checkpoint/checkpoint.h). Created with a checkpoint_dir that holds one, the
// shard starts from the newest good checkpoint ("resumed from step K") and
// then needs a rollback: every generation-checked call is refused until a
// worker rolls the job back (Rollback). Job generations: proto/bnps.proto.
//
// A job resized while it runs (ShardOptions::membership): the barriers of
// step s wait for workers 0..W(s)-1 only. A checkpoint carries the history in
// its config; a restart from it may continue with another history (say,
// another count from the checkpoint's step on) as long as both give the
// steps before the checkpoint the same counts, which is what makes a resize
// at step N and a restart at N the same run; otherwise the checkpoint's
// membership stands (a server restarted with its first flags after workers
// joined). A rollback may also grow the job (Rollback's MembershipChange).
//
// The end of a job: a worker that is done with it calls Leave. Once every
// worker has left (under shrink, or was dropped), the job is complete
// (worker ids above the last step's count that never registered aside): the
// shard writes a final checkpoint of the final state (with a
// checkpoint_dir), calls ShardOptions::on_job_complete, and refuses new
// registrations. Created from such a final checkpoint, the shard is
// complete at once (no rollback to wait for) and serves that state to
// readers (GetStatus, GetDigest, ReadState).
//
// Thread-safety: thread-safe.

#ifndef BNPS_SERVER_SHARD_H_
#define BNPS_SERVER_SHARD_H_

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint.h"
#include "server/admission.h"
#include "server/bn_aggregator.h"
#include "server/step_clocks.h"
#include "server/membership.h"
#include "store/parameter_store.h"
#include "util/byte_budget.h"
#include "util/log_limiter.h"
#include "policy/policy.h"
#include "proto/bnps.pb.h"
#include "proto/checkpoint.pb.h"
#include "proto/membership_history.h"

namespace bnps::server {

// The job as the wire describes it.
proto::JobConfig ToJobConfig(const struct ShardOptions& options);
// The options' BN policy and gradient mode.
policy::JobPolicy JobPolicyOf(const struct ShardOptions& options);

struct ShardOptions {
  std::string job = "bnps";                  // Default: "bnps"
  int shard = 0;                             // Default: 0
  int num_shards = 1;                        // Default: 1
  // The job's worker ids, [0, num_workers). Default: 1.
  int num_workers = 1;
  // How many of them train at each step (proto/membership_history.h): a
  // sync job resized while it runs. Its counts are at most num_workers.
  // Default: unset (num_workers at every step).
  std::optional<proto::MembershipHistory> membership;
  policy::Policy policy = policy::Policy::kSync;  // BN policy. Default: sync
  // The gradient mode; unset: the one `policy` implies (async for async,
  // else sync; policy/policy.h). Default: unset.
  std::optional<policy::Gradients> gradients;
  int64_t staleness = 0;  // async gradients or BN only. Default: 0
  // BN (sync or async) within groups of this many consecutive workers
  // (policy::CheckBnGroups). Default: 0 (none).
  int bn_group_size = 0;
  // BN groups by host (--bn_group=host): the workers that register from one
  // host (Register's `host`) form a group; the groups are fixed once every
  // worker registered (policy::BnGroupsOfHosts) and kept while this server
  // runs. Default: false.
  bool bn_group_by_host = false;
  // Async BN's exact staleness (--bn_staleness): the others' moments of
  // step t - s exactly. -1: the bounded mode (`staleness`).
  int64_t bn_staleness = -1;
  store::OptimizerOptions optimizer;                // Default: see store::OptimizerOptions
  double bn_momentum = 0.1;                  // Default: 0.1
  absl::Duration barrier_timeout = absl::Seconds(60);    // Default: 60 s
  absl::Duration heartbeat_timeout = absl::Seconds(10);  // Default: 10 s
  policy::WorkerLoss worker_loss = policy::WorkerLoss::kFail;            // Default: fail
  absl::Duration tick = absl::Milliseconds(20);          // Default: 20 ms
  bool start_ticker = true;                  // Default: true
  std::function<absl::Time()> now = absl::Now;  // Default: absl::Now
  // Where checkpoints are written and read; empty: none. Default: none.
  std::string checkpoint_dir;
  // A checkpoint every this many steps (parameter versions); 0: only on
  // request (CheckpointNow). Default: 0.
  int64_t checkpoint_every = 0;
  // The largest protobuf message a checkpoint may hold. Tensors are written
  // as raw records of any size beside one message of everything else, so a
  // state of any size is kept; only that message is bounded (a shard of
  // millions of keys). Tests lower it. Default: protobuf's 2 GiB limit.
  size_t checkpoint_max_message_bytes = (size_t{1} << 31) - 1;
  // This server process, as the wire names it; 0: a random one. Default: 0.
  uint64_t server_incarnation = 0;
  // Called once when this process sees the job complete (not when it
  // starts from a final checkpoint), after the final checkpoint was written
  // (with a checkpoint_dir), with that write's status (OK without a
  // checkpoint_dir); on the thread of the last Leave (or the ticker's),
  // without the shard's locks. It must not wait for the server to shut
  // down. Default: none.
  std::function<void(const absl::Status& final_checkpoint)> on_job_complete;
  // The job token, which seals the loss news this shard lists and checks
  // the seal of news it is told (proto's WorkerLoss); empty: none made or
  // checked (a job without a token). Default: none.
  std::string seal_key;
  // The server's one memory budget (ServerLimits::bn_memory_budget_bytes),
  // shared with its BN connections: the recalibration moments and the
  // layer names each BN stream keeps are charged to it too
  // (BnAggregator::Options::memory, ServerMetrics::LayerCache). Null: none
  // (tests of the logic alone). Default: none.
  std::shared_ptr<util::ByteBudget> memory_budget;
};

class Shard {
 public:
  // INVALID_ARGUMENT for inconsistent options (counts < 1, shard out of range,
  // negative staleness or timeouts, learning rate <= 0, a membership with
  // more workers than num_workers, ...); FAILED_PRECONDITION for a
  // membership of more than one count under a policy other than sync.
  static absl::StatusOr<std::unique_ptr<Shard>> Create(ShardOptions options);
  ~Shard();  // stops the ticker; fails what still waits

  const ShardOptions& options() const { return options_; }
  store::ParameterStore& store() { return store_; }
  const store::ParameterStore& store() const { return store_; }
  BnAggregator& bn() { return bn_; }
  const BnAggregator& bn() const { return bn_; }
  Membership& membership() { return membership_; }
  // The job as the wire describes it: ToJobConfig with the membership now.
  proto::JobConfig config() const;
  // Which workers train at each step (ShardOptions::membership, as
  // rollbacks changed it).
  proto::MembershipHistory history() const {
    absl::MutexLock lock(&history_mu_);
    return history_;
  }
  // Non-null on shard 0 under async gradients.
  StepClocks* clocks() { return clocks_.get(); }

  // What a caller that may act as any worker is (the job token, or a job
  // without one): security::TokenAuthenticator::kAnyWorker.
  static constexpr int kAnyWorker = -1;

  // Admits a call as its adapter decoded it (server/admission.h lists the
  // checks, their order and their errors): the guard the adapter holds
  // while the call acts, or the error to answer the call with.
  absl::StatusOr<Admission> Admit(const AdmissionRequest& request);

  // Admit's check of the job and the worker: OK if the request belongs to
  // this job and names a worker of it that `caller` (who the call's token
  // proved it is: a worker id, or kAnyWorker) may act as.
  absl::Status CheckCaller(absl::string_view job, int worker,
                           int caller = kAnyWorker) const;

  // Registers `worker`, run by the process `incarnation` (nonzero), as
  // Membership::Register does: a retry of the same incarnation is OK, another
  // incarnation of a live worker is FAILED_PRECONDITION. A lost worker
  // rejoins (is live again under `incarnation`) if it never took part in the
  // job on this shard: no push of it was accepted here (duplicates aside),
  // no BN contribution of it (forward, backward, recalibration, local
  // running stats), and its clock is 0 (no FinishStep, shard 0 under async).
  // Under shrink the job must also not have begun here without it: no push
  // or BN contribution of any worker was accepted, and every clock is 0.
  // Otherwise FAILED_PRECONDITION saying why. Under --on_worker_loss=wait
  // another incarnation takes the worker's place whether it is live or lost
  // (a restarted process; it then rolls the job back). Errors for the id and
  // the incarnation as Membership's.
  // Under bn_group_by_host `host` names the worker's host: empty is
  // INVALID_ARGUMENT, and once the groups are fixed, another host than the
  // worker's first is FAILED_PRECONDITION (both naming --bn_group=host).
  absl::Status Register(int worker, uint64_t incarnation,
                        const std::string& host = "");

  // `worker`, run by `incarnation`, finished the job (Membership::Finish's
  // errors). The Leave that completes the job returns once the final
  // checkpoint is written, with that write's error if it failed.
  absl::Status Leave(int worker, uint64_t incarnation);
  // Every worker finished the job (above), in this process or before the
  // final checkpoint it started from.
  bool job_complete() const {
    absl::MutexLock lock(&gen_mu_);
    return complete_;
  }
  // A heartbeat of `worker` from the process `incarnation`, as
  // Membership::Heartbeat; but under --on_worker_loss=wait a lost worker
  // heard from again by the same process (a network partition healed) is
  // live again, and the steps that waited for it go on.
  absl::Status Heartbeat(int worker, uint64_t incarnation);
  // Other shards' losses, carried by a worker's accepted heartbeat (proto's
  // WorkerLoss): each worker registered here, live and run by the same
  // process, is lost here too, at once (steps that need it fail, or under
  // shrink it is dropped, as for a loss found here). Ignored under
  // --on_worker_loss=wait, for news of this shard's own, and, with a
  // seal_key, for news whose seal does not hold (logged once per worker).
  void LearnLosses(const std::vector<Membership::Loss>& news);
  // The workers lost here, each with the shard that found it lost (this one
  // for its own findings, sealed with the seal_key), for the heartbeats'
  // answers.
  std::vector<Membership::Loss> Losses() const;

  // Whether `worker` took part in the job here (as Register's rule above).
  bool TookPart(int worker) const;

  // Admit's check of the generation (proto/bnps.proto, "Job generations"):
  // OK if a call of `generation` may proceed; ABORTED containing
  // proto::kRollsBackText otherwise.
  absl::Status CheckGeneration(int64_t generation) const;
  // Restores checkpoint `step` (its newest good one for a negative step:
  // under async, where the shards' checkpoints are not of one moment) as
  // `generation` (proto::RollbackRequest):
  // returns the step decided for `generation`. Waiting calls fail with
  // ABORTED (kRollsBackText). FAILED_PRECONDITION for an older generation
  // or without a checkpoint_dir; NOT_FOUND or DATA_LOSS for a checkpoint
  // that is not there or bad.
  //
  // A rollback may change the job's membership from the decided step on:
  // `change.resize_to` (shard 0: a worker asks to join: at least that many
  // workers from the step on; resizing needs sync, FAILED_PRECONDITION
  // otherwise) or `change.adopt` (the other
  // shards: the membership shard 0 decided; FAILED_PRECONDITION unless it
  // agrees with this shard's before the step). INVALID_ARGUMENT for more
  // workers than the job's ids. Checked before anything changes.
  // `change.shrink_to` (shard 0: the job's highest worker, `leaver`, leaves
  // early: at most that many workers from the step on; FAILED_PRECONDITION
  // for another worker, ids staying dense).
  struct MembershipChange {
    int resize_to = 0;  // 0: none
    int shrink_to = 0;  // 0: none
    int leaver = -1;    // who asks to shrink
    std::optional<proto::MembershipHistory> adopt;
  };
  absl::StatusOr<int64_t> Rollback(int64_t generation, int64_t step,
                                   const MembershipChange& change);
  absl::StatusOr<int64_t> Rollback(int64_t generation, int64_t step) {
    return Rollback(generation, step, MembershipChange());
  }
  // Where `worker` resumes after a rollback, as far as this shard knows: the
  // lowest step of it not applied here (under async also its clock on shard
  // 0); the restored step if the shard holds no parameters.
  int64_t ResumeStep(int worker) const;
  struct GenerationInfo {
    int64_t generation = 0;
    bool needs_rollback = false;
    int64_t restored_step = -1;  // -1: never restored
    // During this generation the shard lost a worker (its heartbeats, or a
    // shard's sealed news) or saw one's process replaced by another
    // (--on_worker_loss=wait): a failure that calls for a new generation
    // (server/rollback_authority.h).
    bool failure_seen = false;
  };
  GenerationInfo generation() const;
  // Whether `worker` is registered here, live, at or above the job's
  // newest count: a worker asking to join (Rollback's resize_to).
  bool Joining(int worker) const;
  // Limits the log lines of refused calls (LogRejected).
  util::LogLimiter& rejection_log() const { return rejection_log_; }
  uint64_t server_incarnation() const { return incarnation_; }
  // ShardOptions::memory_budget (null: none); not owned by the caller.
  util::ByteBudget* memory_budget() const {
    return options_.memory_budget.get();
  }

  // SHA-256s of the parameters (their float32 bytes) and of the BN layers'
  // running statistics ("bn/<layer>": mean then var, float64 bytes), in key
  // order, and the smallest parameter version (proto::DigestResponse).
  struct Digest {
    std::vector<std::pair<std::string, std::string>> entries;
    int64_t step = 0;
  };
  Digest ComputeDigest() const;

  // Writes a checkpoint: under the bulk-synchronous policies, waits until
  // the step boundaries already taken are on disk (a step boundary is the
  // only consistent state); under async, also takes the state now and
  // writes it. FAILED_PRECONDITION without a checkpoint_dir.
  absl::Status CheckpointNow();
  // Blocks until every checkpoint taken so far is written; its status.
  absl::Status FlushCheckpoints();

  // When this process last wrote a checkpoint file; nullopt before the first.
  std::optional<absl::Time> last_checkpoint_written() const;

  // INVALID_ARGUMENT unless this shard owns `key` (proto/sharding.h).
  absl::Status CheckOwned(const std::string& key) const;

  // The deadline of a wait that starts now.
  absl::Time Deadline() const { return options_.now() + options_.barrier_timeout; }

  // Applies heartbeat losses and expires deadlines as of `now`.
  void Tick(absl::Time now);

  // Fails every wait now, as at its deadline (shutting down).
  void ExpireAllWaits();

 private:
  explicit Shard(ShardOptions options);

  // Register's rules on the membership, after its checks of the host.
  absl::Status RegisterLocked(int worker, uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(join_mu_);
  // Under bn_group_by_host: OK if `worker` may register from `host`; after
  // a registration, RecordHost keeps it and fixes the groups once every
  // worker has one.
  absl::Status CheckHost(int worker, const std::string& host) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(join_mu_);
  void RecordHost(int worker, const std::string& host)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(join_mu_);
  // OK if lost `worker` may rejoin (Register's rule); otherwise why not.
  absl::Status MayRejoin(int worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(join_mu_);
  // Fails or drops the workers lost as of `now`.
  void HandleLosses(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(join_mu_);
  // Notes a failure in this generation (GenerationInfo::failure_seen).
  void NoteFailure();
  // Marks the job complete if every worker finished (under shrink, or was
  // dropped) and at least one finished; true if this call did.
  bool MarkCompleteIfDone() ABSL_EXCLUSIVE_LOCKS_REQUIRED(join_mu_);
  // The final checkpoint and on_job_complete, once MarkCompleteIfDone said so.
  absl::Status FinishJob();

  // A checkpoint's worth of state, taken at a boundary, written later.
  struct Taken {
    int64_t step = 0;
    int64_t generation = 0;
    store::StoreState store;
    BnState bn;
    std::vector<Membership::WorkerInfo> workers;
    std::vector<int64_t> clocks;
    bool job_complete = false;
    proto::MembershipHistory history{1};
  };
  // Create's part for a checkpoint_dir: locks it, restores its newest
  // checkpoint that fits the job, starts writer_. FAILED_PRECONDITION for a
  // directory that cannot be locked; Restore's errors but DATA_LOSS.
  absl::Status OpenCheckpointDir();
  // Called by the store at a step boundary, with its lock held.
  void OnBoundary(int64_t step, store::StoreState store);
  void WriterLoop();
  // Writes `head` and `tensors` (each parameter's values, then momentum, in
  // `head`'s order) as checkpoint `step`. RESOURCE_EXHAUSTED if `head` is
  // over options_.checkpoint_max_message_bytes; the checkpoint library's
  // errors otherwise.
  absl::Status WriteState(const proto::ShardCheckpoint& head,
                          const std::vector<absl::string_view>& tensors,
                          int64_t step) const;
  // Restores `payload` (EncodeShardState's, or a serialized
  // proto::ShardCheckpoint of an older server). INVALID_ARGUMENT
  // for a checkpoint of another job config; DATA_LOSS for one that does not
  // fit the job (checked before anything changes). `*changed` (if given):
  // whether some component was restored all the same.
  absl::Status Restore(const std::string& payload, const std::string& from,
                       const absl::Status& why, bool* changed = nullptr);
  // Restore's checks of a checkpoint's state (read from `from`) against
  // this job, before anything changes: DATA_LOSS naming the parameter or
  // BN layer that does not fit (shape, size, worker count, ownership).
  absl::Status CheckRestoredStateFits(const store::StoreState& store,
                                      const BnState& bn,
                                      const std::string& from) const;

  // The workers of `step` (history_).
  int WorkersAt(int64_t step) const {
    absl::MutexLock lock(&history_mu_);
    return history_.WorkersAt(step);
  }
  // The membership `change` makes from `step` on; nullopt for none.
  absl::StatusOr<std::optional<proto::MembershipHistory>> ChangedMembership(
      const MembershipChange& change, int64_t step) const;

  const ShardOptions options_;
  // A leaf: held for reads and for a rollback's change, never while calling
  // out.
  mutable absl::Mutex history_mu_;
  proto::MembershipHistory history_ ABSL_GUARDED_BY(history_mu_);
  store::ParameterStore store_;
  BnAggregator bn_;
  Membership membership_;
  std::unique_ptr<StepClocks> clocks_;
  // Held while a worker turns lost (Tick) or rejoins (Register), so that a
  // rejoin sees a loss either not at all or applied to every component.
  absl::Mutex join_mu_;
  // Workers whose news came with a seal that did not hold, logged once.
  std::set<int> bad_seals_logged_ ABSL_GUARDED_BY(join_mu_);
  // Under bn_group_by_host: each worker's host ("" until it registered),
  // and whether the groups were fixed from them.
  std::vector<std::string> hosts_ ABSL_GUARDED_BY(join_mu_);
  bool groups_fixed_ ABSL_GUARDED_BY(join_mu_) = false;

  // The refused calls' log lines (server/rpc_util.h's LogRejected): at most
  // so many a second, the rest counted.
  mutable util::LogLimiter rejection_log_;

  uint64_t incarnation_ = 0;

  // Per-worker tokens: the workers holding a live BN connection, per
  // BnTransport.
  WorkerClaims bn_claims_[2];

  // Shared by generation-checked calls (their Admission), exclusive for a
  // rollback.
  mutable absl::Mutex rollback_mu_;
  mutable absl::Mutex gen_mu_;
  GenerationInfo gen_ ABSL_GUARDED_BY(gen_mu_);
  bool complete_ ABSL_GUARDED_BY(gen_mu_) = false;

  mutable absl::Mutex writer_mu_;
  std::deque<std::unique_ptr<Taken>> to_write_ ABSL_GUARDED_BY(writer_mu_);
  bool writing_ ABSL_GUARDED_BY(writer_mu_) = false;
  bool stop_writer_ ABSL_GUARDED_BY(writer_mu_) = false;
  // The newest write's: a failed one does not poison the later ones (a
  // directory full or unwritable for a while, then the final checkpoint).
  absl::Status write_status_ ABSL_GUARDED_BY(writer_mu_);
  std::optional<absl::Time> last_written_ ABSL_GUARDED_BY(writer_mu_);
  std::thread writer_;
  // This server's hold on checkpoint_dir (with one).
  std::unique_ptr<checkpoint::DirLock> dir_lock_;

  absl::Notification stop_;
  std::thread ticker_;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_SHARD_H_
