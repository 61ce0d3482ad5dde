#include "server/shard.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/sharding.h"

namespace bnps::server {

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
  if (!options.now) options.now = absl::Now;
  std::unique_ptr<Shard> shard(new Shard(std::move(options)));
  const ShardOptions& o = shard->options_;
  if (o.shard == 0 && o.policy == policy::Policy::kAsync) {
    absl::StatusOr<std::unique_ptr<StepClocks>> clocks =
        StepClocks::Create(o.num_workers, o.staleness);
    if (!clocks.ok()) return clocks.status();
    shard->clocks_ = *std::move(clocks);
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
              options_.optimizer, options_.staleness}),
      bn_({options_.policy, options_.num_workers, options_.staleness,
           options_.bn_momentum,
           [this] { return store_.newest_version(); }}),
      membership_(options_.num_workers, options_.heartbeat_timeout) {}

Shard::~Shard() {
  stop_.Notify();
  if (ticker_.joinable()) ticker_.join();
  ExpireAllWaits();  // nothing may wait on a shard that is gone
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

absl::Status Shard::Register(int worker, uint64_t incarnation) {
  absl::MutexLock lock(&join_mu_);
  const absl::Time now = options_.now();
  if (!membership_.IsLost(worker)) {
    return membership_.Register(worker, incarnation, now);
  }
  if (incarnation == 0) return membership_.Register(worker, incarnation, now);
  if (absl::Status s = MayRejoin(worker); !s.ok()) return s;
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

}  // namespace bnps::server
