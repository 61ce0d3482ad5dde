// Shard's checkpoints, rollbacks and digest: what it takes at a step
// boundary, the writer thread that puts it on disk, restoring it (at start or
// by Rollback), and the hashes of bnps_status --digest. The rest of the class
// is in shard.cc.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/checkpoint.pb.h"
#include "proto/generation.h"
#include "proto/limits.h"
#include "proto/sharding.h"
#include "checkpoint/checkpoint.h"
#include "server/shard.h"
#include "server/shard_state_codec.h"
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

Shard::Digest Shard::ComputeDigest() const {
  Digest d;
  const store::StoreState store = store_.Export();
  d.step = store.keys.empty() ? 0 : INT64_MAX;
  for (const store::StoreState::Key& k : store.keys) {
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

void Shard::OnBoundary(int64_t step, store::StoreState store) {
  // The store's lock is held: nothing of step `step` is in yet anywhere.
  auto taken = std::make_unique<Taken>();
  taken->step = step;
  taken->store = std::move(store);
  taken->bn = bn_.Export();
  taken->workers = membership_.Snapshot();
  taken->history = history();
  for (int w = 0; clocks_ != nullptr && w < options_.num_workers; ++w) {
    taken->clocks.push_back(clocks_->clock(w));
  }
  {
    absl::MutexLock lock(&gen_mu_);
    taken->generation = gen_.generation;
    taken->job_complete = complete_;
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
    t->history.ToConfig(c.mutable_config());
    c.set_step(t->step);
    c.set_generation(t->generation);
    // The tensors go as records of their own, from the taken state itself.
    std::vector<absl::string_view> tensors;
    for (const store::StoreState::Key& k : t->store.keys) {
      proto::ParamState* p = c.add_params();
      p->set_key(k.key);
      for (int64_t d : k.shape) p->add_shape(d);
      tensors.emplace_back(reinterpret_cast<const char*>(k.values->data()),
                           k.values->size() * sizeof(float));
      tensors.emplace_back(reinterpret_cast<const char*>(k.momentum.data()),
                           k.momentum.size() * sizeof(float));
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
      ws->set_finished(t->workers[w].finished);
    }
    c.set_job_complete(t->job_complete);
    c.set_pushes_applied(t->store.applied);
    c.set_pushes_duplicate(t->store.duplicates);
    c.set_newest_push_step(t->store.newest_step);
    c.set_newest_bn_step(t->bn.newest_step);
    for (bool b : t->bn.contributed) c.add_bn_contributed(b);
    absl::Status s = WriteState(c, tensors, t->step);
    if (!s.ok()) {
      std::fprintf(stderr, "bnps_server[%d]: checkpoint of step %lld failed: %s\n",
                   options_.shard, static_cast<long long>(t->step),
                   std::string(s.message()).c_str());
    }
    absl::MutexLock lock(&writer_mu_);
    writing_ = false;
    write_status_ = s;
    if (s.ok()) last_written_ = options_.now();
  }
}

absl::Status Shard::WriteState(const proto::ShardCheckpoint& head,
                               const std::vector<absl::string_view>& tensors,
                               int64_t step) const {
  StatePieces pieces;
  if (absl::Status s = EncodeShardState(
          head, tensors, options_.checkpoint_max_message_bytes, &pieces);
      !s.ok()) {
    return s;
  }
  return checkpoint::WriteCheckpoint(options_.checkpoint_dir, step, pieces.pieces);
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
  if (!policy::BulkSynchronous(JobPolicyOf(options_).gradients)) {
    store::StoreState state = store_.Export();
    int64_t step = 0;
    for (const store::StoreState::Key& k : state.keys) step = std::max(step, k.version);
    OnBoundary(step, std::move(state));
  }
  return FlushCheckpoints();
}

namespace {

// What a checkpoint restores into the store and the BN aggregator.
struct RestoredState {
  store::StoreState store;
  BnState bn;
};

// The parameters and BN layers of checkpoint `c` (read from `from`), as
// the store and the aggregator import them; DATA_LOSS naming what is
// malformed, or worker records of another count than `workers`.
absl::StatusOr<RestoredState> DecodeRestoredState(
    const proto::ShardCheckpoint& c, const std::string& from, size_t workers) {
  auto bad = [&from](const std::string& what) {
    return absl::DataLossError(absl::StrCat(from, ": ", what));
  };
  RestoredState state;
  store::StoreState& store = state.store;
  for (const proto::ParamState& p : c.params()) {
    store::StoreState::Key k;
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
  BnState& bn = state.bn;
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
  return state;
}

}  // namespace

absl::Status Shard::CheckRestoredStateFits(const store::StoreState& store,
                                           const BnState& bn,
                                           const std::string& from) const {
  // Everything is checked before anything changes: a rollback that fails
  // must not leave the store restored and the BN layers or clocks not.
  // (The store and the aggregator check the same again.)
  const size_t workers = static_cast<size_t>(options_.num_workers);
  auto bad = [&from](const std::string& what) {
    return absl::DataLossError(absl::StrCat(from, ": ", what));
  };
  for (const store::StoreState::Key& k : store.keys) {
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
  return absl::OkStatus();
}

absl::Status Shard::Restore(const std::string& payload, const std::string& from,
                            const absl::Status& why, bool* changed) {
  if (changed != nullptr) *changed = false;
  absl::StatusOr<proto::ShardCheckpoint> decoded = DecodeShardState(payload, from);
  if (!decoded.ok()) return decoded.status();
  const proto::ShardCheckpoint& c = *decoded;
  // The membership may go on differently after the checkpoint's step (a
  // restart with another count), never before it.
  proto::JobConfig mine = ToJobConfig(options_);
  proto::JobConfig theirs = c.config();
  absl::StatusOr<proto::MembershipHistory> their_history =
      proto::MembershipHistory::FromConfig(theirs);
  mine.clear_membership();
  theirs.clear_membership();
  if (theirs.SerializeAsString() != mine.SerializeAsString()) {
    return absl::InvalidArgumentError(absl::StrCat(
        from, " is a checkpoint of another job configuration (",
        c.config().ShortDebugString(), "); this server runs ",
        ToJobConfig(options_).ShortDebugString(),
        ": start it with the job's flags, or another --checkpoint_dir"));
  }
  if (!their_history.ok()) {
    return absl::DataLossError(
        absl::StrCat(from, ": ", their_history.status().message()));
  }
  if (their_history->max_workers() > options_.num_workers) {
    return absl::DataLossError(absl::StrCat(
        from, ": its membership ", their_history->ToString(),
        " has more workers than the job's ", options_.num_workers, " ids"));
  }
  // The job's past is the checkpoint's: a membership that gives the steps
  // before it other counts (the servers' flags, after the job grew while it
  // ran) yields to the checkpoint's, which also says what comes next.
  bool adopt_theirs = false;
  if (!their_history->SameBefore(this->history(), c.step())) {
    adopt_theirs = true;
    std::fprintf(stderr,
                 "bnps_server[%d]: %s is of a job whose membership was %s, "
                 "which gives the steps before %lld other counts than %s: "
                 "the checkpoint's membership stands\n",
                 options_.shard, from.c_str(),
                 their_history->ToString().c_str(),
                 static_cast<long long>(c.step()),
                 this->history().ToString().c_str());
  }
  const size_t workers = static_cast<size_t>(options_.num_workers);
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(from, ": ", what));
  };
  absl::StatusOr<RestoredState> state = DecodeRestoredState(c, from, workers);
  if (!state.ok()) return state.status();
  store::StoreState& store = state->store;
  BnState& bn = state->bn;
  if (absl::Status s = CheckRestoredStateFits(store, bn, from); !s.ok()) {
    return s;
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
  if (adopt_theirs) {
    absl::MutexLock lock(&history_mu_);
    history_ = *their_history;
  }
  absl::MutexLock lock(&gen_mu_);
  if (why.ok()) {  // at start: the registrations, as of the checkpoint
    std::vector<Membership::WorkerInfo> infos;
    for (const proto::WorkerState& w : c.workers()) {
      Membership::WorkerInfo info;
      info.registered = w.registered();
      info.lost = w.lost();
      info.incarnation = w.incarnation();
      info.finished = w.finished();
      infos.push_back(info);
    }
    membership_.Restore(infos, options_.now());
    gen_.generation = c.generation();
    complete_ = c.job_complete();
  }
  gen_.restored_step = c.step();
  return absl::OkStatus();
}

absl::StatusOr<std::optional<proto::MembershipHistory>>
Shard::ChangedMembership(const MembershipChange& change, int64_t step) const {
  const proto::MembershipHistory now = history();
  if (change.resize_to > 0 || change.shrink_to > 0) {
    if (absl::Status s = policy::CheckResizable(JobPolicyOf(options_));
        !s.ok()) {
      return s;
    }
    int count = now.WorkersAt(step);
    if (change.resize_to > 0) {
      if (change.resize_to > options_.num_workers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a job of ", options_.num_workers, " worker ids cannot grow to ",
            change.resize_to, " workers"));
      }
      // A join never shrinks the job: another worker may have grown it more.
      count = std::max(change.resize_to, count);
    } else {
      if (change.leaver != count - 1 || change.shrink_to != change.leaver) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker ", change.leaver, " may not leave the job early: only "
            "its highest worker may (", count, " workers from step ", step,
            "; ids stay 0..W-1)"));
      }
      count = std::max(change.shrink_to, 1);
    }
    absl::StatusOr<proto::MembershipHistory> next =
        now.RestartedAt(step, count);
    if (!next.ok()) return next.status();
    return std::optional<proto::MembershipHistory>(*std::move(next));
  }
  if (!change.adopt.has_value() || *change.adopt == now) {
    return std::optional<proto::MembershipHistory>();
  }
  if (change.adopt->max_workers() > options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "membership ", change.adopt->ToString(), " has more workers than the "
        "job's ", options_.num_workers, " ids"));
  }
  if (!change.adopt->SameBefore(now, step)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard 0's membership ", change.adopt->ToString(), " and shard ",
        options_.shard, "'s ", now.ToString(),
        " give the steps before ", step, " other counts"));
  }
  return change.adopt;
}

absl::StatusOr<int64_t> Shard::Rollback(int64_t generation, int64_t step,
                                        const MembershipChange& change) {
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
  const std::string path = checkpoint::CheckpointPath(options_.checkpoint_dir, step);
  absl::StatusOr<checkpoint::CheckpointFile> file =
      step < 0 ? checkpoint::LoadNewestCheckpoint(options_.checkpoint_dir,
                                      absl::StrCat("bnps_server[", options_.shard, "]"))
               : checkpoint::ReadCheckpoint(path);
  if (file.ok() && step < 0) step = file->step;
  if (file.ok() && file->step != step) {
    file = absl::DataLossError(
        absl::StrCat("checkpoint ", path, ": its header names another step"));
  }
  if (absl::IsDataLoss(file.status())) {
    // Not listed any more: the workers choose another step.
    std::fprintf(stderr, "bnps_server[%d]: %s; set aside as %s\n",
                 options_.shard, std::string(file.status().message()).c_str(),
                 checkpoint::SetAside(path).c_str());
  }
  if (!file.ok()) return file.status();
  absl::StatusOr<std::optional<proto::MembershipHistory>> membership =
      ChangedMembership(change, step);
  if (!membership.ok()) return membership.status();
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
  // The membership changes before the generation is published: a worker
  // that registers meanwhile may pair the old generation with the new
  // membership (its calls are then refused, and it recovers), never the new
  // generation with the old one.
  std::optional<proto::MembershipHistory> old_history;
  if (membership->has_value()) {
    absl::MutexLock lock(&history_mu_);
    old_history = history_;
    history_ = **membership;
  }
  GenerationInfo before;
  {
    absl::MutexLock lock(&gen_mu_);
    before = gen_;
    gen_.generation = generation;
    gen_.needs_rollback = false;
    gen_.restored_step = step;
    gen_.failure_seen = false;
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
                   checkpoint::SetAside(file->path).c_str());
    }
    if (old_history.has_value()) {
      absl::MutexLock lock(&history_mu_);
      history_ = *old_history;
    }
    absl::MutexLock lock(&gen_mu_);
    gen_ = before;
    if (changed) gen_.needs_rollback = true;
    return s;
  }
  const std::string resized =
      membership->has_value()
          ? absl::StrCat("; membership ", (*membership)->ToString())
          : "";
  std::fprintf(stderr,
               "bnps_server[%d]: rolled back to step %lld (generation %lld)%s\n",
               options_.shard, static_cast<long long>(step),
               static_cast<long long>(generation), resized.c_str());
  return step;
}

}  // namespace bnps::server
