#include "server/shard.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/generation.h"
#include "proto/sharding.h"
#include "checkpoint/checkpoint.h"
#include "security/worker_token.h"

namespace bnps::server {

proto::JobConfig ToJobConfig(const ShardOptions& o) {
  proto::JobConfig c;
  c.set_job(o.job);
  c.set_num_workers(o.num_workers);
  c.set_num_shards(o.num_shards);
  c.set_shard(o.shard);
  policy::ToConfig(JobPolicyOf(o), &c);
  c.set_staleness(o.staleness);
  c.set_bn_group_size(o.bn_group_size);
  c.set_bn_group_by_host(o.bn_group_by_host);
  if (o.bn_staleness >= 0) c.set_bn_staleness(o.bn_staleness);
  c.set_learning_rate(o.optimizer.learning_rate);
  c.set_momentum(o.optimizer.momentum);
  c.set_weight_decay(o.optimizer.weight_decay);
  c.set_bn_momentum(o.bn_momentum);
  c.set_barrier_timeout_ms(absl::ToInt64Milliseconds(o.barrier_timeout));
  c.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(o.heartbeat_timeout));
  c.set_worker_loss(policy::ToProto(o.worker_loss));
  if (o.membership) o.membership->ToConfig(&c);
  return c;
}

proto::JobConfig Shard::config() const {
  proto::JobConfig c = ToJobConfig(options_);
  history().ToConfig(&c);
  return c;
}

policy::JobPolicy JobPolicyOf(const ShardOptions& o) {
  return {o.policy, o.gradients.value_or(policy::ShorthandGradients(o.policy))};
}

namespace {

// The checks of Shard::Create on its options.
absl::Status CheckShardOptions(const ShardOptions& o) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(what);
  };
  if (o.job.empty()) return bad("job name is empty");
  if (o.num_workers < 1) return bad("num_workers must be at least 1");
  if (o.num_shards < 1) return bad("num_shards must be at least 1");
  if (o.shard < 0 || o.shard >= o.num_shards) {
    return bad(absl::StrCat("shard ", o.shard, " outside [0, ",
                            o.num_shards, ")"));
  }
  if (o.staleness < 0) return bad("staleness must be >= 0");
  if (!(o.optimizer.learning_rate > 0)) return bad("learning_rate must be > 0");
  if (o.optimizer.momentum < 0 || o.optimizer.momentum >= 1) {
    return bad("momentum must be in [0, 1)");
  }
  if (o.optimizer.weight_decay < 0) return bad("weight_decay must be >= 0");
  if (!(o.bn_momentum >= 0 && o.bn_momentum <= 1)) {
    return bad("bn_momentum must be in [0, 1]");
  }
  if (o.barrier_timeout <= absl::ZeroDuration() ||
      o.heartbeat_timeout <= absl::ZeroDuration() ||
      o.tick <= absl::ZeroDuration()) {
    return bad("timeouts and the tick must be positive");
  }
  if (o.membership) {
    if (o.membership->max_workers() > o.num_workers) {
      return bad(absl::StrCat("membership ", o.membership->ToString(),
                              " has more workers than num_workers (",
                              o.num_workers, ")"));
    }
    const std::vector<proto::MembershipHistory::Segment>& seg =
        o.membership->segments();
    if (seg.size() > 1 || seg.front().num_workers != o.num_workers) {
      if (absl::Status s = policy::CheckResizable(JobPolicyOf(o));
          !s.ok()) {
        return s;
      }
    }
  }
  {
    std::vector<int> counts = {o.num_workers};
    if (o.membership) {
      counts.clear();
      for (const auto& seg : o.membership->segments()) {
        counts.push_back(seg.num_workers);
      }
    }
    if (absl::Status s = policy::CheckBnGroups(JobPolicyOf(o),
                                               o.bn_group_size, counts);
        !s.ok()) {
      return s;
    }
    if (o.bn_group_by_host) {
      if (absl::Status s = policy::CheckBnGroupByHost(
              JobPolicyOf(o), o.bn_group_size, counts);
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s =
            policy::CheckBnStaleness(JobPolicyOf(o), o.bn_staleness);
        !s.ok()) {
      return s;
    }
  }
  if (o.checkpoint_every < 0) return bad("checkpoint_every must be >= 0");
  if (o.checkpoint_every > 0 && o.checkpoint_dir.empty()) {
    return bad("checkpoint_every needs a checkpoint_dir");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Shard>> Shard::Create(ShardOptions options) {
  if (absl::Status s = CheckShardOptions(options); !s.ok()) return s;
  if (!options.now) options.now = absl::Now;
  std::unique_ptr<Shard> shard(new Shard(std::move(options)));
  const ShardOptions& o = shard->options_;
  if (o.shard == 0 && !policy::BulkSynchronous(JobPolicyOf(o).gradients)) {
    absl::StatusOr<std::unique_ptr<StepClocks>> clocks =
        StepClocks::Create(o.num_workers, o.staleness);
    if (!clocks.ok()) return clocks.status();
    shard->clocks_ = *std::move(clocks);
  }
  shard->incarnation_ = o.server_incarnation;
  while (shard->incarnation_ == 0) {
    absl::BitGen gen;
    shard->incarnation_ = absl::Uniform<uint64_t>(gen);
  }
  if (!o.checkpoint_dir.empty()) {
    if (absl::Status s = shard->OpenCheckpointDir(); !s.ok()) return s;
  }
  if (o.start_ticker) {
    Shard* s = shard.get();
    s->ticker_ = std::thread([s] {
      while (!s->stop_.WaitForNotificationWithTimeout(s->options_.tick)) {
        s->Tick(s->options_.now());
      }
    });
  }
  return shard;
}

// Locks options_.checkpoint_dir, restores its newest checkpoint that fits
// (setting aside those that do not) and starts the writer.
absl::Status Shard::OpenCheckpointDir() {
  const ShardOptions& o = options_;
  // A directory that cannot be written is said now, not at every
  // checkpoint while the job runs without any to come back to.
  absl::StatusOr<std::unique_ptr<checkpoint::DirLock>> lock =
      checkpoint::LockCheckpointDir(o.checkpoint_dir);
  if (!lock.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint directory: ", lock.status().message()));
  }
  dir_lock_ = *std::move(lock);
  const std::string prefix = absl::StrCat("bnps_server[", o.shard, "]");
  absl::StatusOr<checkpoint::CheckpointFile> file =
      checkpoint::LoadNewestCheckpoint(o.checkpoint_dir, prefix);
  // A file that verifies but does not fit the job (DATA_LOSS; another
  // job's config is refused as it is) is set aside as a torn one, and the
  // previous one is tried: a supervisor's restarts would fail the same way.
  for (;;) {
    if (!file.ok()) break;
    const absl::Status s =
        Restore(file->payload, file->path, absl::OkStatus());
    if (s.ok()) break;
    if (!absl::IsDataLoss(s)) return s;
    std::fprintf(stderr,
                 "%s: %s; set aside as %s; trying the previous one\n",
                 prefix.c_str(), std::string(s.message()).c_str(),
                 checkpoint::SetAside(file->path).c_str());
    file = checkpoint::LoadNewestCheckpoint(o.checkpoint_dir, prefix);
  }
  if (file.ok() && job_complete()) {
    std::fprintf(stderr,
                 "bnps_server[%d]: resumed from the final checkpoint of "
                 "step %lld (%s): the job is complete (every worker "
                 "finished); serving its final state for reads "
                 "(bnps_status, --digest, --export); no worker may join\n",
                 o.shard, static_cast<long long>(file->step),
                 file->path.c_str());
  } else if (file.ok()) {
    absl::MutexLock lock(&gen_mu_);
    gen_.needs_rollback = true;
    std::fprintf(stderr,
                 "bnps_server[%d]: resumed from step %lld (%s, generation "
                 "%lld); waiting for the workers to roll the job back to "
                 "a step every server has\n",
                 o.shard, static_cast<long long>(file->step),
                 file->path.c_str(),
                 static_cast<long long>(gen_.generation));
  } else if (!absl::IsNotFound(file.status())) {
    return file.status();
  } else {
    std::fprintf(stderr, "bnps_server[%d]: no checkpoint in %s: a fresh start\n",
                 o.shard, o.checkpoint_dir.c_str());
  }
  writer_ = std::thread([this] { WriterLoop(); });
  return absl::OkStatus();
}

Shard::Shard(ShardOptions options)
    : options_(std::move(options)),
      history_(options_.membership.value_or(
          proto::MembershipHistory(options_.num_workers))),
      store_({options_.num_workers,
              policy::BulkSynchronous(JobPolicyOf(options_).gradients),
              options_.optimizer, options_.staleness,
              options_.checkpoint_dir.empty() ? 0 : options_.checkpoint_every,
              [this](int64_t step, store::StoreState state) {
                OnBoundary(step, std::move(state));
              },
              [this](int64_t step) { return WorkersAt(step); }}),
      bn_({options_.policy, options_.num_workers, options_.staleness,
           options_.bn_momentum,
           // The version rule of sync BN's steps needs bulk-synchronous
           // versions (one per step).
           policy::BulkSynchronous(JobPolicyOf(options_).gradients)
               ? std::function<int64_t()>(
                     [this] { return store_.newest_version(); })
               : std::function<int64_t()>(),
           [this](int64_t step) { return WorkersAt(step); },
           options_.bn_group_size, options_.bn_group_by_host,
           options_.bn_staleness,
           BnAggregator::Options().recal_bytes_per_worker,
           options_.memory_budget}),
      membership_(options_.num_workers, options_.heartbeat_timeout) {}

Shard::~Shard() {
  stop_.Notify();
  if (ticker_.joinable()) ticker_.join();
  ExpireAllWaits();  // nothing may wait on a shard that is gone
  {
    absl::MutexLock lock(&writer_mu_);
    stop_writer_ = true;
  }
  if (writer_.joinable()) writer_.join();  // writes what was taken
}

void Shard::ExpireAllWaits() {
  store_.ExpireDeadlines(absl::InfiniteFuture());
  bn_.ExpireDeadlines(absl::InfiniteFuture());
  if (clocks_) clocks_->ExpireDeadlines(absl::InfiniteFuture());
}

absl::Status Shard::CheckOwned(const std::string& key) const {
  const int owner = proto::ShardForKey(key, options_.num_shards);
  if (owner != options_.shard) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", key, "' belongs to shard ", owner, ", not shard ", options_.shard));
  }
  return absl::OkStatus();
}

absl::Status Shard::MayRejoin(int worker) const {
  const bool shrink = options_.worker_loss == policy::WorkerLoss::kShrink;
  const std::string lost = membership_.LostText(worker);
  const std::string after =
      shrink ? "; the job went on without it (--on_worker_loss=shrink)"
             : "; the job cannot go on without it (--on_worker_loss=fail): "
               "restart the job's servers";
  const char* held = store_.Pushed(worker)     ? "gradients"
                     : bn_.Contributed(worker) ? "BN statistics"
                     : clocks_ != nullptr && clocks_->clock(worker) > 0
                         ? "step clock"
                         : nullptr;
  if (held != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(lost, " after it took part in the job (shard ",
                     options_.shard, " holds its ", held, ")", after));
  }
  if (shrink) {
    bool begun = store_.GetStats().applied > 0 || bn_.AnyContributed();
    for (int w = 0; clocks_ != nullptr && w < options_.num_workers; ++w) {
      begun = begun || clocks_->clock(w) > 0;
    }
    if (begun) {
      return absl::FailedPreconditionError(
          absl::StrCat(lost,
                       "; the job dropped it and has begun without it "
                       "(--on_worker_loss=shrink)"));
    }
  }
  return absl::OkStatus();
}

bool Shard::TookPart(int worker) const {
  return store_.Pushed(worker) || bn_.Contributed(worker) ||
         (clocks_ != nullptr && clocks_->clock(worker) > 0);
}

absl::Status Shard::Register(int worker, uint64_t incarnation,
                             const std::string& host) {
  absl::MutexLock lock(&join_mu_);
  const bool by_host = options_.bn_group_by_host && worker >= 0 &&
                       worker < options_.num_workers;
  if (by_host) {
    if (absl::Status s = CheckHost(worker, host); !s.ok()) return s;
  }
  absl::Status s = RegisterLocked(worker, incarnation);
  if (s.ok() && by_host) RecordHost(worker, host);
  return s;
}

absl::Status Shard::CheckHost(int worker, const std::string& host) const {
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bn_group=host: worker ", worker, " registered without naming its "
        "host (its client sends none); give the worker --bn_host, or run the "
        "job without --bn_group=host"));
  }
  if (groups_fixed_ && hosts_[worker] != host) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--bn_group=host: worker ", worker, " registers from host '", host,
        "' but the job's BN groups were fixed with it on host '",
        hosts_[worker], "' (restart the servers to form new groups)"));
  }
  return absl::OkStatus();
}

void Shard::RecordHost(int worker, const std::string& host) {
  if (groups_fixed_) return;
  hosts_.resize(options_.num_workers);
  hosts_[worker] = host;
  for (const std::string& h : hosts_) {
    if (h.empty()) return;
  }
  std::vector<int> groups = policy::BnGroupsOfHosts(hosts_);
  std::fprintf(stderr,
               "bnps_server[%d]: BN groups by host (--bn_group=host), by "
               "worker: %s\n",
               options_.shard, absl::StrJoin(groups, ",").c_str());
  bn_.SetGroups(std::move(groups));
  groups_fixed_ = true;
}

absl::Status Shard::RegisterLocked(int worker, uint64_t incarnation) {
  if (job_complete()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", options_.job, "' is complete: every worker ",
        proto::kFinishedText, ". Its final state is served for reads "
        "(bnps_status --export); a new job needs servers with another "
        "--checkpoint_dir"));
  }
  const absl::Time now = options_.now();
  if (options_.worker_loss == policy::WorkerLoss::kWait && incarnation != 0 &&
      worker >= 0 && worker < options_.num_workers) {
    // A restarted process takes the place of the one it replaces, live or
    // lost; its first Rollback brings the job back to where it can join.
    const Membership::WorkerInfo info = membership_.Snapshot()[worker];
    // A worker that finished the job does not come back (Register says so).
    if (info.registered && !info.finished && info.incarnation != incarnation) {
      std::fprintf(stderr,
                   "bnps_server[%d]: worker %d registered from another "
                   "process: it takes the place of the old one "
                   "(--on_worker_loss=wait)\n",
                   options_.shard, worker);
      NoteFailure();
      return membership_.Replace(worker, incarnation, now);
    }
  }
  if (!membership_.IsLost(worker)) {
    return membership_.Register(worker, incarnation, now);
  }
  if (incarnation == 0) return membership_.Register(worker, incarnation, now);
  if (options_.worker_loss != policy::WorkerLoss::kWait) {
    if (absl::Status s = MayRejoin(worker); !s.ok()) return s;
  }
  if (clocks_) {
    if (absl::Status s = clocks_->RestoreWorker(worker); !s.ok()) return s;
  }
  store_.RestoreWorker(worker);
  bn_.RestoreWorker(worker);
  if (absl::Status s = membership_.Rejoin(worker, incarnation, now); !s.ok()) {
    return s;  // not reached: join_mu_ keeps it lost
  }
  std::fprintf(stderr,
               "bnps_server[%d]: worker %d, lost before it took part in the "
               "job, registered again\n",
               options_.shard, worker);
  return absl::OkStatus();
}

absl::Status Shard::Leave(int worker, uint64_t incarnation) {
  {
    absl::MutexLock lock(&join_mu_);
    if (absl::Status s = membership_.Finish(worker, incarnation); !s.ok()) {
      return s;
    }
    if (!MarkCompleteIfDone()) return absl::OkStatus();
  }
  return FinishJob();
}

bool Shard::MarkCompleteIfDone() {
  const bool shrink = options_.worker_loss == policy::WorkerLoss::kShrink;
  bool any = false;
  const int last = WorkersAt(INT64_MAX);
  const std::vector<Membership::WorkerInfo> workers = membership_.Snapshot();
  for (size_t id = 0; id < workers.size(); ++id) {
    const Membership::WorkerInfo& w = workers[id];
    // An id the job no longer trains with that never came.
    if (!w.registered && static_cast<int>(id) >= last) continue;
    if (w.finished) {
      any = true;
    } else if (!(shrink && w.lost)) {
      return false;
    }
  }
  absl::MutexLock lock(&gen_mu_);
  if (!any || complete_) return false;
  complete_ = true;
  return true;
}

absl::Status Shard::FinishJob() {
  absl::Status s;
  std::string said = "no --checkpoint_dir, so no final checkpoint";
  if (!options_.checkpoint_dir.empty()) {
    // No call changes the state any more: it is the final step's.
    store::StoreState state = store_.Export();
    int64_t step = 0;
    for (const store::StoreState::Key& k : state.keys) step = std::max(step, k.version);
    OnBoundary(step, std::move(state));
    s = FlushCheckpoints();
    said = s.ok() ? absl::StrCat("final checkpoint of step ", step,
                                 " written to ", options_.checkpoint_dir)
                  : absl::StrCat("the final checkpoint of step ", step,
                                 " failed: ", s.message());
  }
  std::fprintf(stderr,
               "bnps_server[%d]: every worker finished the job: it is "
               "complete; %s\n",
               options_.shard, said.c_str());
  if (options_.on_job_complete) options_.on_job_complete(s);
  return s;
}

absl::Status Shard::Heartbeat(int worker, uint64_t incarnation) {
  const absl::Time now = options_.now();
  if (options_.worker_loss == policy::WorkerLoss::kWait && incarnation != 0 &&
      membership_.IsLost(worker)) {
    absl::MutexLock lock(&join_mu_);
    const Membership::WorkerInfo info = membership_.Snapshot()[worker];
    if (info.lost && info.incarnation == incarnation) {
      // Under wait nothing of it was dropped: it goes on where it was.
      absl::Status s = membership_.Rejoin(worker, incarnation, now);
      if (s.ok()) {
        std::fprintf(stderr,
                     "bnps_server[%d]: worker %d is heard from again by the "
                     "same process (its network came back); the steps that "
                     "waited for it go on (--on_worker_loss=wait)\n",
                     options_.shard, worker);
      }
      return s;
    }
  }
  return membership_.Heartbeat(worker, incarnation, now);
}

namespace {

// What a loss's seal covers (proto's WorkerLoss).
std::string LossMessage(const std::string& job, const Membership::Loss& l) {
  return absl::StrCat("loss:", job, ":", l.worker, ":", l.incarnation, ":",
                      l.shard, ":", l.reason);
}

}  // namespace

void Shard::LearnLosses(const std::vector<Membership::Loss>& news) {
  if (options_.worker_loss == policy::WorkerLoss::kWait) return;
  const std::string& key = options_.seal_key;
  bool marked = false;
  {
    absl::MutexLock lock(&join_mu_);
    for (const Membership::Loss& loss : news) {
      if (loss.shard == options_.shard || loss.shard < 0 ||
          loss.shard >= options_.num_shards) {
        continue;
      }
      if (!key.empty() && !security::SealMatches(
                              key, LossMessage(options_.job, loss), loss.seal)) {
        if (bad_seals_logged_.insert(loss.worker).second) {
          std::fprintf(stderr,
                       "bnps_server[%d]: news that shard %d lost worker %d "
                       "came without a good seal: ignored (not the job's "
                       "token, or not from a shard)\n",
                       options_.shard, loss.shard, loss.worker);
        }
        continue;
      }
      // A shard's own words are a line; without a seal, news is no place
      // for more.
      constexpr size_t kMaxReasonBytes = 512;
      marked = membership_.MarkLost(
                   loss.worker, loss.incarnation, loss.shard,
                   key.empty() ? loss.reason.substr(0, kMaxReasonBytes)
                               : loss.reason,
                   loss.seal) ||
               marked;
    }
  }
  if (marked) {
    NoteFailure();
    Tick(options_.now());  // fails or drops them now
  }
}

std::vector<Membership::Loss> Shard::Losses() const {
  std::vector<Membership::Loss> losses = membership_.Losses();
  for (Membership::Loss& loss : losses) {
    if (loss.shard >= 0) continue;  // told: passed on as it came
    loss.shard = options_.shard;
    if (!options_.seal_key.empty()) {
      loss.seal = security::Seal(options_.seal_key,
                                 LossMessage(options_.job, loss));
    }
  }
  return losses;
}

void Shard::Tick(absl::Time now) {
  bool completed = false;
  {
    absl::MutexLock lock(&join_mu_);
    HandleLosses(now);
    // Under shrink, the last unfinished worker may be dropped after the
    // others finished.
    if (options_.worker_loss == policy::WorkerLoss::kShrink) {
      completed = MarkCompleteIfDone();
    }
  }
  if (completed) FinishJob().IgnoreError();
  store_.ExpireDeadlines(now);
  bn_.ExpireDeadlines(now);
  if (clocks_) clocks_->ExpireDeadlines(now);
}

void Shard::HandleLosses(absl::Time now) {
  for (int w : membership_.CheckTimeouts(now)) {
    NoteFailure();
    if (options_.worker_loss == policy::WorkerLoss::kWait) {
      std::fprintf(stderr,
                   "bnps_server[%d]: %s: steps wait for it to come back (up "
                   "to their deadlines)\n",
                   options_.shard, membership_.LostText(w).c_str());
      continue;
    }
    std::fprintf(stderr, "bnps_server[%d]: %s: %s\n", options_.shard,
                 membership_.LostText(w).c_str(),
                 options_.worker_loss == policy::WorkerLoss::kShrink
                     ? "dropping it, the job goes on with the others"
                     : "steps that need it fail");
    if (options_.worker_loss == policy::WorkerLoss::kShrink) {
      store_.RemoveWorker(w);
      bn_.RemoveWorker(w);
      if (clocks_) clocks_->RemoveWorker(w);
    } else {
      const absl::Status why =
          absl::FailedPreconditionError(membership_.LostText(w));
      store_.FailWorker(w, why);
      bn_.FailWorker(w, why);
      if (clocks_) clocks_->FailWorker(w, why);
    }
  }
}

int64_t Shard::ResumeStep(int worker) const {
  int64_t next = store_.NextStep(worker);
  if (clocks_ != nullptr) next = std::min(next, clocks_->clock(worker));
  if (next == INT64_MAX) {
    absl::MutexLock lock(&gen_mu_);
    next = std::max<int64_t>(gen_.restored_step, 0);
  }
  return next;
}

Shard::GenerationInfo Shard::generation() const {
  absl::MutexLock lock(&gen_mu_);
  return gen_;
}

void Shard::NoteFailure() {
  absl::MutexLock lock(&gen_mu_);
  gen_.failure_seen = true;
}

bool Shard::Joining(int worker) const {
  if (worker < 0 || worker >= options_.num_workers) return false;
  const Membership::WorkerInfo info = membership_.Snapshot()[worker];
  if (!info.registered || info.lost || info.finished) return false;
  absl::MutexLock lock(&history_mu_);
  return worker >= history_.WorkersAt(INT64_MAX);
}

}  // namespace bnps::server
