// The gRPC client's membership in the job: registration with every shard
// (agreeing on the job's config), heartbeats, the bounded-staleness clocks
// kept by shard 0, and status queries. Internal to client/.
//
// The process is one incarnation of its worker: a random nonzero id drawn
// here, sent with every Register and Heartbeat, so that the servers refuse a
// second process with the same worker id while this one is live.
//
// Thread-safety: thread-safe. The Channels must outlive it.

#ifndef BNPS_CLIENT_INTERNAL_MEMBERSHIP_H_
#define BNPS_CLIENT_INTERNAL_MEMBERSHIP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/grpc_options.h"
#include "client/internal/channels.h"
#include "proto/bnps.pb.h"

namespace bnps::client::internal {

class Membership {
 public:
  explicit Membership(Channels* channels);

  // Joins the job in two rounds. First it reads every shard's config
  // (GetStatus, which joins nothing) and checks it: it must agree with the
  // options and with shard 0's, and options().check_config must accept it
  // (FAILED_PRECONDITION naming the difference, or check_config's error).
  // Only then does it register with every shard, and returns the config.
  // So a worker launched with flags that do not fit the job never joins it.
  // Calls are retried on UNAVAILABLE (a server still starting) and
  // DEADLINE_EXCEEDED with backoff until `deadline` (each attempt gets at
  // most rpc_timeout); a shard not reached by then: UNAVAILABLE or
  // DEADLINE_EXCEEDED naming its address and connect_timeout. A server that
  // refuses the registration (another live process runs this worker id; a
  // lost worker that took part in the job): its FAILED_PRECONDITION.
  // The client takes the servers' job generation. It notes whether a shard
  // says this worker id took part in the job already (rejoining()).
  absl::StatusOr<proto::JobConfig> Register(absl::Time deadline);

  // True if, at Register, a shard said this worker id had taken part in the
  // job: this process is a restart (--on_worker_loss=wait).
  bool rejoining() const { return rejoining_; }

  // Rolls the job back to a step every shard has a checkpoint of, as
  // proto/bnps.proto's "Job generations" describes, and returns the step
  // this worker resumes at (RollbackResponse.resume_step; under sync the
  // checkpoint's step):
  // a new generation if a shard restarted from its checkpoint (or, with
  // `restarted`, because this process is a restart), else the one already
  // decided. Retries unreachable shards until `deadline`.
  // FAILED_PRECONDITION if there is nothing to roll back to (no checkpoint
  // common to every shard) or nothing to roll back (every shard in this
  // client's generation, none restarted); the shards' errors otherwise.
  // With `resize_to` > 0, a new generation in any case, and the job grows
  // to at least that many workers from the decided step on (shard 0 decides
  // it; RollbackRequest.resize_to). Every rollback hands shard 0's
  // membership to the other shards. A `resize_to` that shard 0's
  // membership already meets (another worker's rollback took this one in)
  // starts no generation: the client joins the one that did. So the rule
  // stays as it is (server/rollback_authority.h: a worker's own token joins
  // only from above the job's count), and a join asked twice costs the job
  // no second rollback, whatever the token.
  // Not concurrently with Register or another Recover.
  // With `shrink_to` > 0 (this worker's id: it is the job's highest), a
  // new generation too, and the job goes on without this worker from the
  // decided step on (RollbackRequest.shrink_to).
  absl::StatusOr<int64_t> Recover(bool restarted, absl::Time deadline,
                                  int resize_to = 0, int shrink_to = 0);

  // The job's membership as the shards said at Register or the latest
  // Recover (JobConfig.membership).
  google::protobuf::RepeatedPtrField<proto::MembershipSegment> job_membership()
      const ABSL_LOCKS_EXCLUDED(mu_);

  // One heartbeat to every shard, each with a short deadline; failures are
  // counted, not returned. A FAILED_PRECONDITION answer means the shard no
  // longer counts this process as the worker (it was lost, or another
  // process took its place): dropped() reports it from then on. Does nothing
  // once Stop was called. Carries the workers a shard's answer listed as
  // lost to the shards whose last answer did not (proto's WorkerLoss), in
  // shard order, so news from shard i reaches shards after it in the same
  // round and those before it in the next.
  void SendHeartbeats() ABSL_LOCKS_EXCLUDED(mu_);
  // OK while no shard said that this process was dropped from the job;
  // FAILED_PRECONDITION saying so, and what the shard said, afterwards.
  absl::Status dropped() const ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels a heartbeat in flight and makes later ones no-ops.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  HeartbeatStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // The async policy's clocks, kept by shard 0 (see PsClient).
  absl::StatusOr<int64_t> StartStep(int64_t step);
  absl::Status FinishStep(int64_t completed);

  // What shard `shard` knows. INVALID_ARGUMENT for a shard out of range.
  absl::StatusOr<proto::StatusResponse> GetStatus(int shard);

  // Tells every shard that this worker finished the job (proto's Leave),
  // then stops the heartbeats. The first error of a shard, naming it.
  absl::Status Leave();

 private:
  // Calls call(shard, deadline) until it answers something other than
  // UNAVAILABLE or DEADLINE_EXCEEDED, or `deadline` passes; `rpc` names it.
  absl::Status UntilReached(
      int shard, absl::Time deadline, const char* rpc,
      const std::function<absl::Status(absl::Time)>& call) const;
  // The checks of Register's first round, on shard i's config configs[i].
  absl::Status CheckConfigs(const std::vector<proto::JobConfig>& configs) const;

  // Recover's parts. CheckCanRollBack: FAILED_PRECONDITION naming a shard
  // that answers it keeps no checkpoints. StatusOfAll: every shard's
  // status, in shard order, or the first error (each asked for its warrant
  // for `next_generation`, if above 0). RollbackAll: the Rollback
  // to `generation` at *step on every shard, shard 0 deciding the step
  // (unless `async`) and the membership, its request carrying `warrant`,
  // the others' shard 0's warrant; *resume: the smallest step a
  // shard says to resume at (INT64_MAX: none); the first error.
  absl::Status CheckCanRollBack() const;
  absl::Status StatusOfAll(absl::Time deadline,
                           std::vector<proto::StatusResponse>* st,
                           int64_t next_generation = 0) const;
  absl::Status RollbackAll(absl::Time deadline, int64_t generation, bool async,
                           int resize_to, int shrink_to,
                           const std::string& warrant, int64_t* step,
                           int64_t* resume) const;
  // The first shard's failure warrant for `generation`
  // (StatusResponse.generation_warrant); empty if none has one (shard 0
  // then decides on what it saw itself) or a shard is out of reach.
  std::string FailureWarrant(absl::Time deadline, int64_t generation) const;

  // Register's second round, on every shard.
  absl::Status RegisterAll(absl::Time deadline,
                           std::vector<proto::JobConfig>* configs);

  Channels* const channels_;  // not owned
  const uint64_t incarnation_;
  bool rejoining_ = false;  // set by Register
  int64_t registered_generation_ = 0;  // the newest generation at Register

  mutable absl::Mutex mu_;
  google::protobuf::RepeatedPtrField<proto::MembershipSegment> job_membership_
      ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* heartbeat_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  HeartbeatStats stats_ ABSL_GUARDED_BY(mu_);
  // Every loss a shard listed, by (worker, incarnation); and, by shard, the
  // losses its last accepted answer listed (news for it: the rest).
  std::map<std::pair<int, uint64_t>, proto::WorkerLoss> losses_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::set<std::pair<int, uint64_t>>> listed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_MEMBERSHIP_H_
