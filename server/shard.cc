#include "server/shard.h"

#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "proto/checkpoint.pb.h"
#include "proto/generation.h"
#include "proto/limits.h"
#include "proto/sharding.h"
#include "server/checkpoint.h"
#include "util/sha256.h"

namespace bnps::server {
namespace {

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}
std::string DoubleBytes(const std::vector<double>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(double));
}
template <typename T>
bool FromBytes(const std::string& b, std::vector<T>* out) {
  if (b.size() % sizeof(T) != 0) return false;
  out->resize(b.size() / sizeof(T));
  if (!b.empty()) std::memcpy(out->data(), b.data(), b.size());
  return true;
}

}  // namespace

proto::JobConfig ToJobConfig(const ShardOptions& o) {
  proto::JobConfig c;
  c.set_job(o.job);
  c.set_num_workers(o.num_workers);
  c.set_num_shards(o.num_shards);
  c.set_shard(o.shard);
  c.set_policy(policy::ToProto(o.policy));
  c.set_staleness(o.staleness);
  c.set_learning_rate(o.optimizer.learning_rate);
  c.set_momentum(o.optimizer.momentum);
  c.set_weight_decay(o.optimizer.weight_decay);
  c.set_bn_momentum(o.bn_momentum);
  c.set_barrier_timeout_ms(absl::ToInt64Milliseconds(o.barrier_timeout));
  c.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(o.heartbeat_timeout));
  c.set_worker_loss(policy::ToProto(o.worker_loss));
  return c;
}

struct Shard::Taken {
  int64_t step = 0;
  int64_t generation = 0;
  StoreState store;
  BnState bn;
  std::vector<Membership::WorkerInfo> workers;
  std::vector<int64_t> clocks;
};

absl::StatusOr<std::unique_ptr<Shard>> Shard::Create(ShardOptions options) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(what);
  };
  if (options.job.empty()) return bad("job name is empty");
  if (options.num_workers < 1) return bad("num_workers must be at least 1");
  if (options.num_shards < 1) return bad("num_shards must be at least 1");
  if (options.shard < 0 || options.shard >= options.num_shards) {
    return bad(absl::StrCat("shard ", options.shard, " outside [0, ",
                            options.num_shards, ")"));
  }
  if (options.staleness < 0) return bad("staleness must be >= 0");
  if (!(options.optimizer.learning_rate > 0)) return bad("learning_rate must be > 0");
  if (options.optimizer.momentum < 0 || options.optimizer.momentum >= 1) {
    return bad("momentum must be in [0, 1)");
  }
  if (options.optimizer.weight_decay < 0) return bad("weight_decay must be >= 0");
  if (!(options.bn_momentum >= 0 && options.bn_momentum <= 1)) {
    return bad("bn_momentum must be in [0, 1]");
  }
  if (options.barrier_timeout <= absl::ZeroDuration() ||
      options.heartbeat_timeout <= absl::ZeroDuration() ||
      options.tick <= absl::ZeroDuration()) {
    return bad("timeouts and the tick must be positive");
  }
  if (options.checkpoint_every < 0) return bad("checkpoint_every must be >= 0");
  if (options.checkpoint_every > 0 && options.checkpoint_dir.empty()) {
    return bad("checkpoint_every needs a checkpoint_dir");
  }
  if (!options.now) options.now = absl::Now;
  std::unique_ptr<Shard> shard(new Shard(std::move(options)));
  const ShardOptions& o = shard->options_;
  if (o.shard == 0 && o.policy == policy::Policy::kAsync) {
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
    // A directory that cannot be written is said now, not at every
    // checkpoint while the job runs without any to come back to.
    if (absl::Status d = CreateCheckpointDir(o.checkpoint_dir); !d.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint directory: ", d.message()));
    }
    const std::string prefix = absl::StrCat("bnps_server[", o.shard, "]");
    absl::StatusOr<CheckpointFile> file =
        LoadNewestCheckpoint(o.checkpoint_dir, prefix);
    // A file that verifies but does not fit the job (DATA_LOSS; another
    // job's config is refused as it is) is set aside as a torn one, and the
    // previous one is tried: a supervisor's restarts would fail the same way.
    for (;;) {
      if (!file.ok()) break;
      const absl::Status s =
          shard->Restore(file->payload, file->path, absl::OkStatus());
      if (s.ok()) break;
      if (!absl::IsDataLoss(s)) return s;
      std::fprintf(stderr,
                   "%s: %s; set aside as %s; trying the previous one\n",
                   prefix.c_str(), std::string(s.message()).c_str(),
                   SetAside(file->path).c_str());
      file = LoadNewestCheckpoint(o.checkpoint_dir, prefix);
    }
    if (file.ok()) {
      absl::MutexLock lock(&shard->gen_mu_);
      shard->gen_.needs_rollback = true;
      std::fprintf(stderr,
                   "bnps_server[%d]: resumed from step %lld (%s, generation "
                   "%lld); waiting for the workers to roll the job back to "
                   "a step every server has\n",
                   o.shard, static_cast<long long>(file->step),
                   file->path.c_str(),
                   static_cast<long long>(shard->gen_.generation));
    } else if (!absl::IsNotFound(file.status())) {
      return file.status();
    } else {
      std::fprintf(stderr, "bnps_server[%d]: no checkpoint in %s: a fresh start\n",
                   o.shard, o.checkpoint_dir.c_str());
    }
    Shard* s = shard.get();
    s->writer_ = std::thread([s] { s->WriterLoop(); });
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

Shard::Shard(ShardOptions options)
    : options_(std::move(options)),
      store_({options_.num_workers, policy::BulkSynchronous(options_.policy),
              options_.optimizer, options_.staleness,
              options_.checkpoint_dir.empty() ? 0 : options_.checkpoint_every,
              [this](int64_t step, StoreState state) {
                OnBoundary(step, std::move(state));
              }}),
      bn_({options_.policy, options_.num_workers, options_.staleness,
           options_.bn_momentum,
           [this] { return store_.newest_version(); }}),
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

absl::Status Shard::CheckCaller(const std::string& job, int worker) const {
  if (job != options_.job) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request for job '", job, "' reached a server of job '", options_.job, "'"));
  }
  if (worker < 0 || worker >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " outside the job's [0, ", options_.num_workers, ")"));
  }
  return absl::OkStatus();
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

absl::Status Shard::Register(int worker, uint64_t incarnation) {
  absl::MutexLock lock(&join_mu_);
  const absl::Time now = options_.now();
  if (options_.worker_loss == policy::WorkerLoss::kWait && incarnation != 0 &&
      worker >= 0 && worker < options_.num_workers) {
    // A restarted process takes the place of the one it replaces, live or
    // lost; its first Rollback brings the job back to where it can join.
    const Membership::WorkerInfo info = membership_.Snapshot()[worker];
    if (info.registered && info.incarnation != incarnation) {
      std::fprintf(stderr,
                   "bnps_server[%d]: worker %d registered from another "
                   "process: it takes the place of the old one "
                   "(--on_worker_loss=wait)\n",
                   options_.shard, worker);
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

void Shard::Tick(absl::Time now) {
  {
    absl::MutexLock lock(&join_mu_);
    HandleLosses(now);
  }
  store_.ExpireDeadlines(now);
  bn_.ExpireDeadlines(now);
  if (clocks_) clocks_->ExpireDeadlines(now);
}

void Shard::HandleLosses(absl::Time now) {
  for (int w : membership_.CheckTimeouts(now)) {
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

absl::Status Shard::CheckGeneration(int64_t generation) const {
  absl::MutexLock lock(&gen_mu_);
  if (gen_.needs_rollback) {
    return absl::AbortedError(absl::StrCat(
        "shard ", options_.shard, " restarted from its checkpoint of step ",
        gen_.restored_step, ": ", proto::kRollsBackText,
        " to a step every server has"));
  }
  if (generation != gen_.generation) {
    return absl::AbortedError(absl::StrCat(
        "a call of job generation ", generation, " reached shard ",
        options_.shard, " in generation ", gen_.generation, ": ",
        proto::kRollsBackText, " (to step ", gen_.restored_step, ")"));
  }
  return absl::OkStatus();
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

Shard::Digest Shard::ComputeDigest() const {
  Digest d;
  const StoreState store = store_.Export();
  d.step = store.keys.empty() ? 0 : INT64_MAX;
  for (const StoreState::Key& k : store.keys) {
    d.entries.emplace_back(k.key, util::Sha256Of(FloatBytes(*k.values)));
    d.step = std::min(d.step, k.version);
  }
  for (const BnState::Layer& l : bn_.Export().layers) {
    if (!l.running.has_value()) continue;
    d.entries.emplace_back(
        absl::StrCat("bn/", l.name),
        util::Sha256Of(DoubleBytes(l.running->mean) + DoubleBytes(l.running->var)));
  }
  return d;
}

Shard::GenerationInfo Shard::generation() const {
  absl::MutexLock lock(&gen_mu_);
  return gen_;
}

void Shard::OnBoundary(int64_t step, StoreState store) {
  // The store's lock is held: nothing of step `step` is in yet anywhere.
  auto taken = std::make_unique<Taken>();
  taken->step = step;
  taken->store = std::move(store);
  taken->bn = bn_.Export();
  taken->workers = membership_.Snapshot();
  for (int w = 0; clocks_ != nullptr && w < options_.num_workers; ++w) {
    taken->clocks.push_back(clocks_->clock(w));
  }
  {
    absl::MutexLock lock(&gen_mu_);
    taken->generation = gen_.generation;
  }
  absl::MutexLock lock(&writer_mu_);
  // The previous boundary must be on disk before this one is taken (the
  // store waits, only if the disk is slower than the training): a shard
  // killed at any moment has the previous boundary at least, and keeps the
  // last kKeepCheckpoints, so the shards always have a step in common.
  writer_mu_.Await(absl::Condition(
      +[](Shard* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->writer_mu_) {
        return s->stop_writer_ || (s->to_write_.empty() && !s->writing_);
      },
      this));
  to_write_.push_back(std::move(taken));
}

void Shard::WriterLoop() {
  for (;;) {
    std::unique_ptr<Taken> t;
    {
      absl::MutexLock lock(&writer_mu_);
      writer_mu_.Await(absl::Condition(
          +[](Shard* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->writer_mu_) {
            return s->stop_writer_ || !s->to_write_.empty();
          },
          this));
      if (to_write_.empty()) return;  // stopping, all written
      t = std::move(to_write_.front());
      to_write_.pop_front();
      writing_ = true;
    }
    proto::ShardCheckpoint c;
    *c.mutable_config() = ToJobConfig(options_);
    c.set_step(t->step);
    c.set_generation(t->generation);
    for (const StoreState::Key& k : t->store.keys) {
      proto::ParamState* p = c.add_params();
      p->set_key(k.key);
      for (int64_t d : k.shape) p->add_shape(d);
      p->set_values(FloatBytes(*k.values));
      p->set_momentum(FloatBytes(k.momentum));
      p->set_version(k.version);
      for (int64_t l : k.last_pushed) p->add_last_pushed(l);
    }
    for (const BnState::Layer& l : t->bn.layers) {
      proto::BnLayerState* b = c.add_bn_layers();
      b->set_layer(l.name);
      b->set_channels(l.channels);
      b->set_has_running(l.running.has_value());
      if (l.running.has_value()) {
        b->set_running_mean(DoubleBytes(l.running->mean));
        b->set_running_var(DoubleBytes(l.running->var));
      }
      b->set_newest_forward(l.newest_forward);
      b->set_newest_backward(l.newest_backward);
    }
    for (size_t w = 0; w < t->workers.size(); ++w) {
      proto::WorkerState* ws = c.add_workers();
      ws->set_registered(t->workers[w].registered);
      ws->set_lost(t->workers[w].lost);
      ws->set_incarnation(t->workers[w].incarnation);
      ws->set_clock(w < t->clocks.size() ? t->clocks[w] : 0);
    }
    c.set_pushes_applied(t->store.applied);
    c.set_pushes_duplicate(t->store.duplicates);
    c.set_newest_push_step(t->store.newest_step);
    c.set_newest_bn_step(t->bn.newest_step);
    for (bool b : t->bn.contributed) c.add_bn_contributed(b);
    absl::Status s =
        WriteCheckpoint(options_.checkpoint_dir, t->step, c.SerializeAsString());
    if (!s.ok()) {
      std::fprintf(stderr, "bnps_server[%d]: checkpoint of step %lld failed: %s\n",
                   options_.shard, static_cast<long long>(t->step),
                   std::string(s.message()).c_str());
    }
    absl::MutexLock lock(&writer_mu_);
    writing_ = false;
    write_status_.Update(s);
    if (s.ok()) last_written_ = options_.now();
  }
}

std::optional<absl::Time> Shard::last_checkpoint_written() const {
  absl::MutexLock lock(&writer_mu_);
  return last_written_;
}

absl::Status Shard::FlushCheckpoints() {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError("the server has no --checkpoint_dir");
  }
  absl::MutexLock lock(&writer_mu_);
  writer_mu_.Await(absl::Condition(
      +[](Shard* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->writer_mu_) {
        return s->to_write_.empty() && !s->writing_;
      },
      this));
  return write_status_;
}

absl::Status Shard::CheckpointNow() {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError("the server has no --checkpoint_dir");
  }
  if (!policy::BulkSynchronous(options_.policy)) {
    StoreState state = store_.Export();
    int64_t step = 0;
    for (const StoreState::Key& k : state.keys) step = std::max(step, k.version);
    OnBoundary(step, std::move(state));
  }
  return FlushCheckpoints();
}

absl::Status Shard::Restore(const std::string& payload, const std::string& from,
                            const absl::Status& why, bool* changed) {
  if (changed != nullptr) *changed = false;
  proto::ShardCheckpoint c;
  if (!c.ParseFromString(payload)) {
    return absl::DataLossError(absl::StrCat(from, ": not a shard checkpoint"));
  }
  const proto::JobConfig mine = ToJobConfig(options_);
  if (c.config().SerializeAsString() != mine.SerializeAsString()) {
    return absl::InvalidArgumentError(absl::StrCat(
        from, " is a checkpoint of another job configuration (",
        c.config().ShortDebugString(), "); this server runs ",
        mine.ShortDebugString(),
        ": start it with the job's flags, or another --checkpoint_dir"));
  }
  const size_t workers = static_cast<size_t>(options_.num_workers);
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(from, ": ", what));
  };
  StoreState store;
  for (const proto::ParamState& p : c.params()) {
    StoreState::Key k;
    k.key = p.key();
    k.shape.assign(p.shape().begin(), p.shape().end());
    auto values = std::make_shared<std::vector<float>>();
    if (!FromBytes(p.values(), values.get()) ||
        !FromBytes(p.momentum(), &k.momentum)) {
      return bad(absl::StrCat("parameter '", p.key(), "' is malformed"));
    }
    k.values = std::move(values);
    k.version = p.version();
    k.last_pushed.assign(p.last_pushed().begin(), p.last_pushed().end());
    store.keys.push_back(std::move(k));
  }
  store.applied = c.pushes_applied();
  store.duplicates = c.pushes_duplicate();
  store.newest_step = c.newest_push_step();
  BnState bn;
  for (const proto::BnLayerState& l : c.bn_layers()) {
    BnState::Layer out;
    out.name = l.layer();
    out.channels = l.channels();
    if (l.has_running()) {
      bn::RunningStats r;
      if (!FromBytes(l.running_mean(), &r.mean) ||
          !FromBytes(l.running_var(), &r.var)) {
        return bad(absl::StrCat("BN layer '", l.layer(), "' is malformed"));
      }
      out.running = std::move(r);
    }
    out.newest_forward = l.newest_forward();
    out.newest_backward = l.newest_backward();
    bn.layers.push_back(std::move(out));
  }
  bn.newest_step = c.newest_bn_step();
  bn.contributed.assign(c.bn_contributed().begin(), c.bn_contributed().end());
  if (bn.contributed.size() != workers ||
      static_cast<size_t>(c.workers_size()) != workers) {
    return bad("worker records of another worker count");
  }
  // Everything is checked before anything changes: a rollback that fails
  // must not leave the store restored and the BN layers or clocks not.
  // (The store and the aggregator check the same again.)
  for (const StoreState::Key& k : store.keys) {
    int64_t n = 1;
    bool fits = k.values->size() == k.momentum.size() &&
                k.last_pushed.size() == workers && k.version >= 0;
    for (int64_t d : k.shape) {
      fits = fits && d >= 0 &&
             (d == 0 || n <= static_cast<int64_t>(k.values->size()) / d);
      if (fits) n *= d;
    }
    if (!fits || n != static_cast<int64_t>(k.values->size())) {
      return bad(absl::StrCat("parameter '", k.key, "' does not fit this job"));
    }
    if (k.key.empty() || k.key.size() > proto::kMaxKeyBytes ||
        n > proto::kMaxTensorElements) {
      return bad(absl::StrCat("parameter '", k.key, "' does not fit this job"));
    }
    if (absl::Status s = CheckOwned(k.key); !s.ok()) {
      return bad(std::string(s.message()));
    }
  }
  for (const BnState::Layer& l : bn.layers) {
    if (l.channels < 0 || l.channels > proto::kMaxChannels ||
        (l.running.has_value() &&
         (static_cast<int64_t>(l.running->mean.size()) != l.channels ||
          static_cast<int64_t>(l.running->var.size()) != l.channels))) {
      return bad(absl::StrCat("BN layer '", l.name, "' does not fit its channels"));
    }
  }
  // The clocks first: their restore checks the staleness bound as it goes,
  // and changes nothing when it fails.
  if (clocks_ != nullptr) {
    std::vector<int64_t> clocks;
    for (const proto::WorkerState& w : c.workers()) clocks.push_back(w.clock());
    if (absl::Status s = clocks_->Restore(clocks, why); !s.ok()) {
      return bad(std::string(s.message()));
    }
    if (changed != nullptr) *changed = true;
  }
  if (absl::Status s = store_.Import(store, why); !s.ok()) return bad(std::string(s.message()));
  if (changed != nullptr) *changed = true;
  if (absl::Status s = bn_.Import(bn, why); !s.ok()) return bad(std::string(s.message()));
  absl::MutexLock lock(&gen_mu_);
  if (why.ok()) {  // at start: the registrations, as of the checkpoint
    std::vector<Membership::WorkerInfo> infos;
    for (const proto::WorkerState& w : c.workers()) {
      Membership::WorkerInfo info;
      info.registered = w.registered();
      info.lost = w.lost();
      info.incarnation = w.incarnation();
      infos.push_back(info);
    }
    membership_.Restore(infos, options_.now());
    gen_.generation = c.generation();
  }
  gen_.restored_step = c.step();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Shard::Rollback(int64_t generation, int64_t step) {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard,
        " has no --checkpoint_dir: the job cannot roll back"));
  }
  // One rollback at a time, and none while a checked call is under way; the
  // generation is decided under gen_mu_ below.
  absl::MutexLock exclusive(&rollback_mu_);
  absl::MutexLock join(&join_mu_);
  {
    absl::MutexLock lock(&gen_mu_);
    if (generation < gen_.generation) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rollback to generation ", generation, " is stale: shard ",
          options_.shard, " is in generation ", gen_.generation));
    }
    if (generation == gen_.generation && !gen_.needs_rollback) {
      return gen_.restored_step;  // decided already
    }
  }
  const std::string path = CheckpointPath(options_.checkpoint_dir, step);
  absl::StatusOr<CheckpointFile> file =
      step < 0 ? LoadNewestCheckpoint(options_.checkpoint_dir,
                                      absl::StrCat("bnps_server[", options_.shard, "]"))
               : ReadCheckpoint(path);
  if (file.ok() && step < 0) step = file->step;
  if (file.ok() && file->step != step) {
    file = absl::DataLossError(
        absl::StrCat("checkpoint ", path, ": its header names another step"));
  }
  if (absl::IsDataLoss(file.status())) {
    // Not listed any more: the workers choose another step.
    std::fprintf(stderr, "bnps_server[%d]: %s; set aside as %s\n",
                 options_.shard, std::string(file.status().message()).c_str(),
                 SetAside(path).c_str());
  }
  if (!file.ok()) return file.status();
  const absl::Status why = absl::AbortedError(absl::StrCat(
      "shard ", options_.shard, " rolled back to step ", step, " (generation ",
      generation, "): ", proto::kRollsBackText));
  // Later boundaries of the old generation are not written: they would be
  // of the same bits, but the directory must not mix generations mid-write.
  if (absl::Status s = FlushCheckpoints(); !s.ok()) {
    std::fprintf(stderr, "bnps_server[%d]: %s\n", options_.shard,
                 std::string(s.message()).c_str());
  }
  // The generation is published before the waiting calls fail, so that a
  // worker they wake finds the rollback under way (GetStatus) and joins it.
  GenerationInfo before;
  {
    absl::MutexLock lock(&gen_mu_);
    before = gen_;
    gen_.generation = generation;
    gen_.needs_rollback = false;
    gen_.restored_step = step;
  }
  bool changed = false;
  if (absl::Status s = Restore(file->payload, file->path, why, &changed);
      !s.ok()) {
    // Restore checks before it changes anything; should a part have changed
    // all the same, no call may reach a shard half restored: it waits for
    // another rollback.
    if (absl::IsDataLoss(s)) {
      // Its checksum is right but not its content: as a torn file, it is
      // set aside, so that the workers' next try picks another step.
      std::fprintf(stderr, "bnps_server[%d]: %s; set aside as %s\n",
                   options_.shard, std::string(s.message()).c_str(),
                   SetAside(file->path).c_str());
    }
    absl::MutexLock lock(&gen_mu_);
    gen_ = before;
    if (changed) gen_.needs_rollback = true;
    return s;
  }
  std::fprintf(stderr,
               "bnps_server[%d]: rolled back to step %lld (generation %lld)\n",
               options_.shard, static_cast<long long>(step),
               static_cast<long long>(generation));
  return step;
}

}  // namespace bnps::server
