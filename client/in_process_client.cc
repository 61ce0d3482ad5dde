#include "client/in_process_client.h"

#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/sharding.h"
#include "server/shard_service.h"

namespace bnps::test {
namespace {

// Starts an operation that answers through a callback taking T, and blocks
// until it has answered (maybe on another thread, maybe before returning).
template <typename T>
T Await(const std::function<void(std::function<void(T)>)>& start) {
  // Shared with the callback, which may still be unlocking when we return.
  struct State {
    absl::Mutex mu;
    std::optional<T> result ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  start([state](T r) {
    absl::MutexLock lock(&state->mu);
    state->result.emplace(std::move(r));
  });
  absl::MutexLock lock(&state->mu);
  state->mu.Await(absl::Condition(
      +[](std::optional<T>* r) { return r->has_value(); }, &state->result));
  return *std::move(state->result);
}

}  // namespace

absl::StatusOr<std::unique_ptr<InProcessJob>> InProcessJob::Create(
    server::ShardOptions options, int num_shards) {
  std::unique_ptr<InProcessJob> job(new InProcessJob());
  options.num_shards = num_shards;
  for (int i = 0; i < num_shards; ++i) {
    options.shard = i;
    absl::StatusOr<std::unique_ptr<server::Shard>> shard =
        server::Shard::Create(options);
    if (!shard.ok()) return shard.status();
    job->shards_.push_back(*std::move(shard));
  }
  return job;
}

absl::StatusOr<std::unique_ptr<InProcessPsClient>> InProcessPsClient::Connect(
    InProcessJob* job, int worker) {
  const uint64_t incarnation = job->NewIncarnation();
  for (int i = 0; i < job->num_shards(); ++i) {
    server::Shard& shard = job->shard(i);
    absl::Status s = shard.CheckCaller(shard.options().job, worker);
    if (s.ok()) s = shard.Register(worker, incarnation);
    if (!s.ok()) return s;
  }
  return std::unique_ptr<InProcessPsClient>(new InProcessPsClient(
      job, worker, incarnation, job->shard(0).config()));
}

server::Shard& InProcessPsClient::ShardOf(const std::string& key) {
  server::Shard& shard =
      job_->shard(proto::ShardForKey(key, job_->num_shards()));
  // A lost worker stays lost: the error shows at the call that needs it.
  shard.membership()
      .Heartbeat(worker_, incarnation_, shard.options().now())
      .IgnoreError();
  return shard;
}

absl::Status InProcessPsClient::InitParameters(const client::Params& params) {
  for (const auto& [key, p] : params) {
    absl::StatusOr<bool> fresh = ShardOf(key).store().Init(key, p.shape, p.values);
    if (!fresh.ok()) return fresh.status();
  }
  return absl::OkStatus();
}

absl::Status InProcessPsClient::PushGradients(int64_t step,
                                              int64_t num_samples,
                                              const client::Params& grads) {
  for (const auto& [key, g] : grads) {
    absl::StatusOr<store::ParameterStore::PushResult> r =
        ShardOf(key).store().Push(worker_, step, key, g.shape, g.values,
                                  num_samples);
    if (!r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat("PushGradients of step ", step, ": ",
                                       r.status().message()));
    }
  }
  return absl::OkStatus();
}

absl::Status InProcessPsClient::PushGradients(
    int64_t step, int64_t num_samples,
    std::shared_ptr<const client::Params> grads) {
  if (grads == nullptr) {
    return absl::InvalidArgumentError("PushGradients: null gradients");
  }
  return PushGradients(step, num_samples, *grads);
}

namespace {

class ImmediatePush final : public client::GradientPush {
 public:
  ImmediatePush(InProcessPsClient* client, int64_t step, int64_t num_samples)
      : client_(client), step_(step), num_samples_(num_samples) {}
  void Add(std::shared_ptr<const client::Params> part) override {
    if (part == nullptr) return;
    // Every part is pushed, even after one failed, as over gRPC.
    absl::Status s = client_->PushGradients(step_, num_samples_, *part);
    if (status_.ok()) status_ = s;
  }
  absl::Status Finish() override { return status_; }
  void Abandon() override {}  // every part is pushed as it comes

 private:
  InProcessPsClient* const client_;
  const int64_t step_;
  const int64_t num_samples_;
  absl::Status status_;
};

}  // namespace

std::unique_ptr<client::GradientPush> InProcessPsClient::StartPush(
    int64_t step, int64_t num_samples) {
  return std::make_unique<ImmediatePush>(this, step, num_samples);
}

absl::Status InProcessPsClient::PullParametersInto(int64_t min_version,
                                                   client::Params* params) {
  const bool every_key = params->empty();
  std::vector<std::vector<std::string>> keys(job_->num_shards());
  for (const auto& [key, p] : *params) {
    keys[proto::ShardForKey(key, job_->num_shards())].push_back(key);
  }
  for (int i = 0; i < job_->num_shards(); ++i) {
    if (!every_key && keys[i].empty()) continue;  // nothing wanted here
    server::Shard& shard = job_->shard(i);
    using Result = absl::StatusOr<store::ParameterStore::Snapshot>;
    Result snap = Await<Result>([&](std::function<void(Result)> done) {
      shard.store().Pull(keys[i], min_version, shard.Deadline(),
                         std::move(done));
    });
    if (!snap.ok()) return snap.status();
    for (const auto& [key, t] : *snap) {
      client::Param& p = (*params)[key];
      p.shape = t.shape;
      p.values = *t.values;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<server::BnAggregator::Reply> InProcessPsClient::Bn(
    const std::string& layer,
    const std::function<void(server::Shard&, server::BnAggregator::Done)>&
        start) {
  server::Shard& shard = ShardOf(layer);
  using Result = absl::StatusOr<server::BnAggregator::Reply>;
  return Await<Result>([&](std::function<void(Result)> done) {
    start(shard, [done = std::move(done)](const Result& r) { done(r); });
  });
}

absl::StatusOr<client::BnForwardResult> InProcessPsClient::BnForward(
    const std::string& layer, int64_t step, const bn::Moments& local,
    bool want_running) {
  absl::StatusOr<server::BnAggregator::Reply> r =
      Bn(layer, [&](server::Shard& s, server::BnAggregator::Done done) {
        s.bn().Forward(worker_, step, layer, local, s.Deadline(),
                       std::move(done));
      });
  if (!r.ok()) return r.status();
  client::BnForwardResult result;
  result.merged = r->moments;
  if (want_running) result.running = r->running;
  result.contributors = r->contributors;
  return result;
}

absl::StatusOr<bn::BackwardSums> InProcessPsClient::BnBackward(
    const std::string& layer, int64_t step, const bn::BackwardSums& local) {
  absl::StatusOr<server::BnAggregator::Reply> r =
      Bn(layer, [&](server::Shard& s, server::BnAggregator::Done done) {
        s.bn().Backward(worker_, step, layer, local, s.Deadline(),
                        std::move(done));
      });
  if (!r.ok()) return r.status();
  return r->sums;
}

absl::Status InProcessPsClient::BnRecal(const std::string& layer,
                                        int64_t batch,
                                        const bn::Moments& moments) {
  return Bn(layer,
            [&](server::Shard& s, server::BnAggregator::Done done) {
              s.bn().Recal(worker_, batch, layer, moments, std::move(done));
            })
      .status();
}

absl::StatusOr<bn::RunningStats> InProcessPsClient::BnRecalFinish(
    const std::string& layer) {
  absl::StatusOr<server::BnAggregator::Reply> r =
      Bn(layer, [&](server::Shard& s, server::BnAggregator::Done done) {
        s.bn().RecalFinish(worker_, layer, s.Deadline(), std::move(done));
      });
  if (!r.ok()) return r.status();
  if (!r->running.has_value()) return absl::InternalError("no running stats");
  return *r->running;
}

absl::StatusOr<bn::RunningStats> InProcessPsClient::BnLocalRunning(
    const std::string& layer, const bn::RunningStats& running) {
  absl::StatusOr<server::BnAggregator::Reply> r =
      Bn(layer, [&](server::Shard& s, server::BnAggregator::Done done) {
        s.bn().LocalRunning(worker_, layer, running, s.Deadline(),
                            std::move(done));
      });
  if (!r.ok()) return r.status();
  if (!r->running.has_value()) return absl::InternalError("no running stats");
  return *r->running;
}

absl::StatusOr<bn::RunningStats> InProcessPsClient::BnRunning(
    const std::string& layer, int64_t channels) {
  std::optional<bn::RunningStats> r = ShardOf(layer).bn().Running(layer);
  if (!r.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("layer '", layer, "' has no running stats yet"));
  }
  if (static_cast<int64_t>(r->mean.size()) != channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer '", layer, "' has ", r->mean.size(), " channels, not ",
        channels));
  }
  return *r;
}

absl::StatusOr<int64_t> InProcessPsClient::StartStep(int64_t step) {
  server::Shard& shard = job_->shard(0);
  if (shard.clocks() == nullptr) {
    return absl::FailedPreconditionError(
        "step clocks are kept by shard 0 under the async policy only");
  }
  using Result = absl::StatusOr<int64_t>;
  return Await<Result>([&](std::function<void(Result)> done) {
    shard.clocks()->StartStep(worker_, step, shard.Deadline(), std::move(done));
  });
}

absl::Status InProcessPsClient::FinishStep(int64_t completed) {
  server::Shard& shard = job_->shard(0);
  if (shard.clocks() == nullptr) {
    return absl::FailedPreconditionError(
        "step clocks are kept by shard 0 under the async policy only");
  }
  return shard.clocks()->FinishStep(worker_, completed);
}

std::vector<int> InProcessPsClient::LiveWorkers() const {
  return job_->shard(0).membership().LiveWorkers();
}

}  // namespace bnps::test
