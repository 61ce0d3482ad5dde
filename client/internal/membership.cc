#include "client/internal/membership.h"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/message_differencer.h"
#include "policy/policy.h"
#include "proto/codec.h"
#include "proto/generation.h"
#include "proto/membership_history.h"

namespace bnps::client::internal {
namespace {

// This machine's host name (RegisterRequest.host); empty if it has none.
std::string LocalHostName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

// The time left for Connect's last attempt at a shard: enough for a refused
// connection to show as such rather than as a deadline.
constexpr absl::Duration kLastAttempt = absl::Milliseconds(100);

// Connect's failures that mean "no server answered (yet)".
bool Unreachable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

// A random nonzero id for this process (absl::BitGen is seeded from the OS).
uint64_t NewIncarnation() {
  absl::BitGen gen;
  uint64_t id = 0;
  while (id == 0) id = absl::Uniform<uint64_t>(gen);
  return id;
}

}  // namespace

Membership::Membership(Channels* channels)
    : channels_(channels), incarnation_(NewIncarnation()) {}

absl::Status Membership::UntilReached(
    int shard, absl::Time deadline, const char* rpc,
    const std::function<absl::Status(absl::Time)>& call) const {
  const GrpcClientOptions& options = channels_->options();
  absl::Status status;
  int attempts = 0;
  while (true) {
    ++attempts;
    status = call(std::min(deadline, absl::Now() + options.rpc_timeout));
    // UNAVAILABLE: the server may still be starting. DEADLINE_EXCEEDED: an
    // attempt got rpc_timeout, and connect_timeout may be longer (GetStatus
    // and a repeated Register are harmless).
    if (!Unreachable(status)) break;
    // The last attempt comes just before the deadline rather than a
    // backoff early, so Connect takes connect_timeout, not up to 2 s less.
    const absl::Duration left = deadline - absl::Now();
    if (left < kLastAttempt) break;
    absl::SleepFor(
        std::min(channels_->Backoff(attempts - 1), left - kLastAttempt));
  }
  if (Unreachable(status)) {
    return Annotate(
        status,
        absl::StrCat("cannot reach ", channels_->ShardName(shard),
                     ": no answer to ", rpc, " within connect_timeout ",
                     absl::FormatDuration(options.connect_timeout), " (",
                     attempts, attempts == 1 ? " attempt)" : " attempts)"));
  }
  return Annotate(status,
                  absl::StrCat(rpc, " with ", channels_->ShardName(shard)));
}

absl::StatusOr<proto::JobConfig> Membership::Register(absl::Time deadline) {
  const GrpcClientOptions& options = channels_->options();
  const int shards = channels_->num_shards();
  // Round 1: read every shard's config; nothing joins yet.
  std::vector<proto::JobConfig> configs(shards);
  for (int i = 0; i < shards; ++i) {
    proto::StatusResponse response;
    absl::Status s =
        UntilReached(i, deadline, "GetStatus", [&](absl::Time call_deadline) {
          return channels_->Call(i, call_deadline, [&](grpc::ClientContext& c) {
            return proto::FromGrpcStatus(channels_->shard(i).stub->GetStatus(
                &c, proto::StatusRequest(), &response));
          });
        });
    if (!s.ok()) return s;
    configs[i] = response.config();
    for (const proto::WorkerStatus& w : response.workers()) {
      if (w.worker() == options.worker && w.took_part()) rejoining_ = true;
    }
  }
  if (absl::Status s = CheckConfigs(configs); !s.ok()) return s;
  if (options.check_config) {
    if (absl::Status s = options.check_config(configs[0]); !s.ok()) return s;
  }
  // Round 2: join.
  if (absl::Status s = RegisterAll(deadline, &configs); !s.ok()) return s;
  // Only a server restarted with another config between the rounds fails
  // here.
  if (absl::Status s = CheckConfigs(configs); !s.ok()) return s;
  return configs[0];
}

absl::Status Membership::RegisterAll(absl::Time deadline,
                                     std::vector<proto::JobConfig>* configs) {
  const GrpcClientOptions& options = channels_->options();
  const int shards = channels_->num_shards();
  int64_t generation = 0, shard0_generation = 0;
  proto::RegisterRequest request;
  request.set_job(options.job);
  request.set_worker(options.worker);
  request.set_num_workers(options.num_workers);
  request.set_num_shards(shards);
  request.set_incarnation(incarnation_);
  request.set_host(options.host.empty() ? LocalHostName() : options.host);
  for (int i = 0; i < shards; ++i) {
    proto::RegisterResponse response;
    absl::Status s =
        UntilReached(i, deadline, "Register", [&](absl::Time call_deadline) {
          return channels_->Call(i, call_deadline, [&](grpc::ClientContext& c) {
            return proto::FromGrpcStatus(
                channels_->shard(i).stub->Register(&c, request, &response));
          });
        });
    if (!s.ok()) return s;
    (*configs)[i] = response.config();
    generation = std::max(generation, response.generation());
    if (i == 0) shard0_generation = response.generation();
    channels_->set_bn_port(i, response.bn_port());
    channels_->set_bn_unix_socket(
        i, {response.bn_unix_path(), response.server_incarnation()});
  }
  registered_generation_ = generation;
  // A client that joins late joins the generation the job is in: shard 0's,
  // with shard 0's membership, which a rollback of that generation decided.
  // A shard already in a later one (a rollback under way) refuses this
  // client's calls until it recovers into that one.
  if (channels_->generation() < shard0_generation) {
    channels_->set_generation(shard0_generation);
  }
  {
    absl::MutexLock lock(&mu_);
    job_membership_ = (*configs)[0].membership();
  }
  return absl::OkStatus();
}

google::protobuf::RepeatedPtrField<proto::MembershipSegment>
Membership::job_membership() const {
  absl::MutexLock lock(&mu_);
  return job_membership_;
}

namespace {

// The newest checkpoint step every shard of `st` has; FAILED_PRECONDITION
// when there is none (`pending`: a shard restarted, else this worker).
absl::StatusOr<int64_t> CommonCheckpointStep(
    const std::vector<proto::StatusResponse>& st, bool pending) {
  std::vector<int64_t> common(st[0].checkpoint_steps().begin(),
                              st[0].checkpoint_steps().end());
  for (size_t i = 1; i < st.size(); ++i) {
    std::vector<int64_t> keep;
    for (int64_t k : common) {
      if (std::find(st[i].checkpoint_steps().begin(),
                    st[i].checkpoint_steps().end(),
                    k) != st[i].checkpoint_steps().end()) {
        keep.push_back(k);
      }
    }
    common = std::move(keep);
  }
  if (common.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        pending ? "a shard restarted from its checkpoint"
                : "this worker restarted",
        ", but no checkpoint step is common to every shard (do they all "
        "run with --checkpoint_dir and --checkpoint_every_steps?): the "
        "job cannot roll back; restart it from the beginning"));
  }
  return *std::max_element(common.begin(), common.end());
}

// The workers `config`'s membership counts from its last segment on; 0 for
// a membership that does not parse (it counts no one).
int WorkersAtEnd(const proto::JobConfig& config) {
  absl::StatusOr<proto::MembershipHistory> h =
      proto::MembershipHistory::FromConfig(config);
  return h.ok() ? h->segments().back().num_workers : 0;
}

}  // namespace

absl::Status Membership::CheckCanRollBack() const {
  const GrpcClientOptions& options = channels_->options();
  // A job whose servers keep no checkpoints cannot roll back: say so at once
  // rather than wait for a server that is down.
  for (int i = 0; i < channels_->num_shards(); ++i) {
    proto::StatusResponse r;
    const absl::Status s = channels_->Call(
        i, absl::Now() + options.rpc_timeout, [&](grpc::ClientContext& c) {
          return proto::FromGrpcStatus(
              channels_->shard(i).stub->GetStatus(&c, proto::StatusRequest(), &r));
        });
    if (s.ok() && r.checkpoint_dir().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          channels_->ShardName(i),
          " keeps no checkpoints (--checkpoint_dir): the job cannot roll back"));
    }
  }
  return absl::OkStatus();
}

absl::Status Membership::StatusOfAll(absl::Time deadline,
                                     std::vector<proto::StatusResponse>* st,
                                     int64_t next_generation) const {
  st->assign(channels_->num_shards(), proto::StatusResponse());
  proto::StatusRequest request;
  request.set_next_generation(next_generation);
  for (int i = 0; i < channels_->num_shards(); ++i) {
    absl::Status s =
        UntilReached(i, deadline, "GetStatus", [&](absl::Time call_deadline) {
          return channels_->Call(i, call_deadline, [&](grpc::ClientContext& c) {
            return proto::FromGrpcStatus(channels_->shard(i).stub->GetStatus(
                &c, request, &(*st)[i]));
          });
        });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string Membership::FailureWarrant(absl::Time deadline,
                                       int64_t generation) const {
  std::vector<proto::StatusResponse> st;
  if (!StatusOfAll(deadline, &st, generation).ok()) return "";
  for (const proto::StatusResponse& r : st) {
    if (!r.generation_warrant().empty()) return r.generation_warrant();
  }
  return "";
}

absl::Status Membership::RollbackAll(absl::Time deadline, int64_t generation,
                                     bool async, int resize_to, int shrink_to,
                                     const std::string& warrant, int64_t* step,
                                     int64_t* resume) const {
  const GrpcClientOptions& options = channels_->options();
  // Shard 0 decides; the others follow its step.
  absl::Status s;
  *resume = INT64_MAX;
  // Shard 0 decides the membership too; the others take it.
  google::protobuf::RepeatedPtrField<proto::MembershipSegment> decided;
  // With per-worker tokens, shard 0's warrant is what lets the others follow
  // it (server/rollback_authority.h).
  std::string decided_warrant;
  for (int i = 0; i < channels_->num_shards() && s.ok(); ++i) {
    proto::RollbackRequest request;
    request.set_job(options.job);
    request.set_worker(options.worker);
    request.set_generation(generation);
    request.set_step(*step);
    if (i == 0) {
      request.set_resize_to(resize_to);
      request.set_shrink_to(shrink_to);
      request.set_warrant(warrant);
    } else {
      *request.mutable_membership() = decided;
      request.set_warrant(decided_warrant);
    }
    proto::RollbackResponse response;
    s = UntilReached(i, deadline, "Rollback", [&](absl::Time call_deadline) {
      return channels_->Call(i, call_deadline, [&](grpc::ClientContext& c) {
        return proto::FromGrpcStatus(
            channels_->shard(i).stub->Rollback(&c, request, &response));
      });
    });
    if (s.ok()) {
      if (!async) *step = response.step();
      if (i == 0) {
        decided = response.membership();
        decided_warrant = response.warrant();
      }
      *resume = std::min(*resume, response.resume_step());
    }
  }
  return s;
}

absl::StatusOr<int64_t> Membership::Recover(bool restarted,
                                            absl::Time deadline,
                                            int resize_to, int shrink_to) {
  constexpr int kRounds = 20;
  if (absl::Status s = CheckCanRollBack(); !s.ok()) return s;
  absl::Status last;
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) absl::SleepFor(channels_->Backoff(std::min(round - 1, 4)));
    std::vector<proto::StatusResponse> st;
    if (absl::Status s = StatusOfAll(deadline, &st); !s.ok()) return s;
    int64_t newest = 0;
    bool pending = false, behind = false;
    for (const proto::StatusResponse& r : st) {
      newest = std::max(newest, r.generation());
      pending = pending || r.needs_rollback();
    }
    for (const proto::StatusResponse& r : st) {
      behind = behind || r.generation() < newest;
    }
    if (newest < 0 || newest >= proto::kMaxGeneration) {
      return absl::DataLossError(absl::StrCat(
          "a shard answered generation ", newest, ", outside 0..",
          proto::kMaxGeneration - 1, ": refusing to roll the job on from it"));
    }
    // Shard 0 rolls back first: a shard ahead of it answered after a
    // rollback that shard 0 answered before. A join reads shard 0's
    // membership: it looks again.
    if (resize_to > 0 && st[0].generation() < newest &&
        !st[0].needs_rollback()) {
      last = absl::FailedPreconditionError(absl::StrCat(
          "shard 0 answered generation ", st[0].generation(),
          " and another shard ", newest, ": a rollback under way"));
      continue;
    }
    // A worker asking to join whom shard 0's membership counts already
    // (another worker's rollback took it in meanwhile) joins the generation
    // that did; forcing one more would take a reason the shards saw, which
    // a worker's own token lacks (server/rollback_authority.h).
    const bool taken_in =
        resize_to > 0 && WorkersAtEnd(st[0].config()) >= resize_to;
    const int grow_to = taken_in ? 0 : resize_to;
    const bool force =
        (restarted && newest <= registered_generation_) || grow_to > 0 ||
        shrink_to > 0;
    int64_t generation = newest, step = st[0].restored_step();
    // Async gradients: the shards' checkpoints are not of one moment.
    const absl::StatusOr<policy::JobPolicy> job =
        policy::FromConfig(channels_->config());
    const bool async =
        job.ok() && !policy::BulkSynchronous(job->gradients);
    if ((pending || force) && async) {
      // Under async the shards' checkpoints are not of one moment anyway:
      // each restores its newest, and every worker resumes at the lowest of
      // its steps some shard lacks (duplicates are acknowledged).
      generation = newest + 1;
      step = -1;
    } else if (pending || force) {
      // A new generation, at the newest step every shard has.
      generation = newest + 1;
      absl::StatusOr<int64_t> common = CommonCheckpointStep(st, pending);
      if (!common.ok()) return common.status();
      step = *common;
    } else if (!behind && generation == channels_->generation() &&
               !taken_in) {
      return absl::FailedPreconditionError(
          "nothing to roll back: every shard is in this worker's generation");
    }
    if (async) step = -1;
    // A new generation: a shard's word that it saw a failure calling for
    // it, for a worker that holds only its own token.
    const std::string warrant = generation > st[0].generation() ||
                                        st[0].needs_rollback()
                                    ? FailureWarrant(deadline, generation)
                                    : "";
    int64_t resume = INT64_MAX;
    if (absl::Status s = RollbackAll(deadline, generation, async, grow_to,
                                     shrink_to, warrant, &step, &resume);
        !s.ok()) {
      // Someone went further meanwhile (a stale generation), or the step is
      // gone: look again. So too where a shard's pending restart alone
      // called for a new generation and a worker's own token was refused
      // it: another worker's rollback may have brought that shard in since
      // (its warrant gone with its reason), and the next look joins that
      // generation.
      last = s;
      if (absl::IsFailedPrecondition(s) || absl::IsNotFound(s) ||
          absl::IsDataLoss(s) ||
          (absl::IsPermissionDenied(s) && pending && !force)) {
        continue;
      }
      return s;
    }
    channels_->set_generation(generation);
    // A restarted shard knows the registrations of its checkpoint; a worker
    // restarted since then registers again (it takes its place under wait).
    std::vector<proto::JobConfig> configs(channels_->num_shards());
    if (absl::Status r = RegisterAll(deadline, &configs); !r.ok()) return r;
    registered_generation_ = generation;
    return resume == INT64_MAX ? step : resume;
  }
  return Annotate(last, absl::StrCat("no rollback agreed after ", kRounds,
                                     " rounds"));
}

absl::Status Membership::CheckConfigs(
    const std::vector<proto::JobConfig>& configs) const {
  const GrpcClientOptions& options = channels_->options();
  for (int i = 0; i < channels_->num_shards(); ++i) {
    const proto::JobConfig& c = configs[i];
    const std::string who = channels_->ShardName(i);
    if (c.job() != options.job) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, " runs job '", c.job(), "', not '", options.job, "'"));
    }
    if (c.num_workers() != options.num_workers) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, " runs a job of ", c.num_workers(),
          " workers; this worker was told ", options.num_workers));
    }
    if (c.num_shards() != channels_->num_shards()) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, " runs a job of ", c.num_shards(),
                       " shards; this worker was given ", channels_->num_shards(),
                       " server addresses"));
    }
    if (c.shard() != i) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, " is shard ", c.shard(),
                       " of the job; list the servers in "
                       "shard order"));
    }
    if (c.policy() == proto::POLICY_UNSPECIFIED) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, " reports no BN policy"));
    }
    if (i > 0) {
      proto::JobConfig a = configs[0];
      proto::JobConfig b = c;
      a.clear_shard();
      b.clear_shard();
      // Shard 0's membership is the job's: the others take it at the
      // rollback under way when they differ (a worker joining).
      a.clear_membership();
      b.clear_membership();
      std::string report;
      google::protobuf::util::MessageDifferencer differencer;
      differencer.ReportDifferencesToString(&report);
      if (!differencer.Compare(a, b)) {
        return absl::FailedPreconditionError(absl::StrCat(
            who, " runs the job with a different config than shard 0: ",
            absl::StripTrailingAsciiWhitespace(report)));
      }
    }
  }
  const proto::JobConfig& config = configs[0];
  if (config.heartbeat_timeout_ms() > 0 &&
      options.heartbeat_interval >=
          absl::Milliseconds(config.heartbeat_timeout_ms())) {
    return absl::FailedPreconditionError(
        absl::StrCat("heartbeat_interval ",
                     absl::FormatDuration(options.heartbeat_interval),
                     " is not shorter than the servers' heartbeat timeout of ",
                     config.heartbeat_timeout_ms(), " ms"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Membership::StartStep(int64_t step) {
  const GrpcClientOptions& options = channels_->options();
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("StartStep: negative step ", step));
  }
  proto::StartStepRequest request;
  request.set_job(options.job);
  request.set_worker(options.worker);
  request.set_step(step);
  proto::StartStepResponse response;
  absl::Status s = channels_->WithRetries(0, [&](grpc::ClientContext& context) {
    return proto::FromGrpcStatus(
        channels_->shard(0).stub->StartStep(&context, request, &response));
  });
  if (!s.ok()) {
    return Annotate(s, absl::StrCat("StartStep ", step, " on ", channels_->ShardName(0)));
  }
  return response.min_clock();
}

absl::Status Membership::FinishStep(int64_t completed) {
  const GrpcClientOptions& options = channels_->options();
  if (completed < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FinishStep: negative clock ", completed));
  }
  proto::FinishStepRequest request;
  request.set_job(options.job);
  request.set_worker(options.worker);
  request.set_completed(completed);
  absl::Status s = channels_->WithRetries(0, [&](grpc::ClientContext& context) {
    proto::FinishStepResponse response;
    return proto::FromGrpcStatus(
        channels_->shard(0).stub->FinishStep(&context, request, &response));
  });
  return Annotate(s,
                  absl::StrCat("FinishStep ", completed, " on ", channels_->ShardName(0)));
}

absl::StatusOr<proto::StatusResponse> Membership::GetStatus(int shard) {
  if (shard < 0 || shard >= channels_->num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GetStatus: shard ", shard, " is not in [0, ", channels_->num_shards(), ")"));
  }
  proto::StatusResponse response;
  absl::Status s =
      channels_->WithRetries(shard, [&](grpc::ClientContext& context) {
    return proto::FromGrpcStatus(channels_->shard(shard).stub->GetStatus(
        &context, proto::StatusRequest(), &response));
  });
  if (!s.ok())
    return Annotate(s, absl::StrCat("GetStatus of ", channels_->ShardName(shard)));
  return response;
}

absl::Status Membership::Leave() {
  const GrpcClientOptions& options = channels_->options();
  proto::LeaveRequest request;
  request.set_job(options.job);
  request.set_worker(options.worker);
  request.set_incarnation(incarnation_);
  const absl::Status s =
      RunParallel(channels_->num_shards(), [&](int i) {
        absl::Status r =
            channels_->WithRetries(i, [&](grpc::ClientContext& context) {
          proto::LeaveResponse response;
          return proto::FromGrpcStatus(
              channels_->shard(i).stub->Leave(&context, request, &response));
        });
        return Annotate(r, absl::StrCat("Leave of ", channels_->ShardName(i)));
      });
  // Done with the job either way: a shard that did not take the Leave sees
  // the worker go silent instead.
  Stop();
  return s;
}

void Membership::SendHeartbeats() {
  const GrpcClientOptions& options = channels_->options();
  // Short deadlines: a dead shard must not delay the others' heartbeats much.
  const absl::Duration timeout =
      std::min(options.rpc_timeout,
               std::max(options.heartbeat_interval, absl::Seconds(1)));
  proto::HeartbeatRequest request;
  request.set_job(options.job);
  request.set_worker(options.worker);
  request.set_incarnation(incarnation_);
  for (int i = 0; i < channels_->num_shards(); ++i) {
    bool stopping = false;
    proto::HeartbeatResponse response;
    const absl::Status s = channels_->Call(
        i, absl::Now() + timeout, [&](grpc::ClientContext& context) {
          {
            absl::MutexLock lock(&mu_);
            stopping = stopping_;
            if (stopping) return absl::CancelledError("stopping");
            heartbeat_context_ = &context;
            listed_.resize(channels_->num_shards());
            request.clear_losses();
            for (const auto& [key, loss] : losses_) {
              if (loss.shard() != i && listed_[i].count(key) == 0) {
                *request.add_losses() = loss;
              }
            }
          }
          const absl::Status r = proto::FromGrpcStatus(
              channels_->shard(i).stub->Heartbeat(&context, request, &response));
          absl::MutexLock lock(&mu_);
          heartbeat_context_ = nullptr;
          return r;
        });
    if (stopping) return;
    absl::MutexLock lock(&mu_);
    ++stats_.sent;
    if (!s.ok()) {
      ++stats_.failed;
      stats_.last_error =
          Annotate(s, absl::StrCat("Heartbeat to ", channels_->ShardName(i)));
      // The shard no longer counts this process as the worker: final.
      if (absl::IsFailedPrecondition(s) && stats_.dropped.ok()) {
        stats_.dropped = absl::FailedPreconditionError(
            absl::StrCat("worker ", options.worker,
                         " is no longer in the job, so it stops: ",
                         stats_.last_error.message()));
      }
      continue;
    }
    stats_.losses_relayed += request.losses_size();
    listed_[i].clear();
    for (const proto::WorkerLoss& loss : response.lost()) {
      const std::pair<int, uint64_t> key(loss.worker(), loss.incarnation());
      listed_[i].insert(key);
      losses_.emplace(key, loss);
    }
    if (i == 0) {
      stats_.live_workers.assign(response.live_workers().begin(),
                                 response.live_workers().end());
    }
  }
  // News that no shard lists any more (the worker registered again, or was
  // replaced, everywhere it was lost) is stale: forget it.
  absl::MutexLock lock(&mu_);
  for (auto it = losses_.begin(); it != losses_.end();) {
    const bool listed =
        std::any_of(listed_.begin(), listed_.end(),
                    [&](const auto& keys) { return keys.count(it->first); });
    it = listed ? std::next(it) : losses_.erase(it);
  }
}

void Membership::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  if (heartbeat_context_ != nullptr) heartbeat_context_->TryCancel();
}

absl::Status Membership::dropped() const {
  absl::MutexLock lock(&mu_);
  return stats_.dropped;
}

HeartbeatStats Membership::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace bnps::client::internal
