#include "client/worker_bn.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "policy/async_bn.h"

namespace bnps::client {

absl::StatusOr<WorkerBn> WorkerBn::FromConfig(const proto::JobConfig& config) {
  absl::StatusOr<policy::JobPolicy> p = policy::FromConfig(config);
  if (!p.ok()) return p.status();
  return WorkerBn(p->bn, config.bn_momentum());
}

absl::Status WorkerBn::CheckLayer(const std::string& layer, bool tracks_running,
                                  std::optional<double> momentum) const {
  if (!PlanForward(tracks_running).want_running) return absl::OkStatus();
  if (momentum.has_value() &&
      std::abs(*momentum - job_bn_momentum_) <= 1e-12) {
    return absl::OkStatus();
  }
  const std::string mine =
      momentum.has_value() ? absl::StrCat(*momentum) : std::string("None");
  return absl::InvalidArgumentError(absl::StrCat(
      "bnps SyncBatchNorm '", layer, "': momentum ", mine,
      " differs from the job's bn_momentum ", job_bn_momentum_,
      ", which the servers' running statistics use under policy async; set "
      "the layer's momentum to ",
      job_bn_momentum_, " or start the servers with --bn_momentum=", mine));
}

BnForwardPlan WorkerBn::PlanForward(bool tracks_running) const {
  BnForwardPlan plan;
  plan.exchange = policy::BnTrafficWhileTraining(policy_);
  plan.want_running = tracks_running && policy_ == policy::Policy::kAsync;
  return plan;
}

absl::StatusOr<BnForwardOutcome> WorkerBn::Resolve(
    const bn::Moments& local,
    const std::optional<BnForwardResult>& answer) const {
  const bool exchange = policy::BnTrafficWhileTraining(policy_);
  if (exchange != answer.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy ", policy::PolicyName(policy_),
        exchange ? " normalizes with the servers' answer, and none was given"
                 : " sends nothing, and an answer was given"));
  }
  BnForwardOutcome out;
  out.global_backward = GlobalBackward();
  switch (policy_) {
    case policy::Policy::kSync:
      // The global moments are bitwise the same on every worker, so are
      // the running statistics updated with them.
      out.normalize = answer->merged;
      out.running = RunningUpdate::kFromBatch;
      break;
    case policy::Policy::kAsync: {
      absl::StatusOr<bn::Moments> m =
          policy::NormalizingMoments(local, answer->merged);
      if (!m.ok()) return m.status();
      out.normalize = *std::move(m);
      if (answer->running.has_value()) {
        out.running = RunningUpdate::kFromServers;
        out.servers_running = answer->running;
      }
      break;
    }
    case policy::Policy::kLocal:
    case policy::Policy::kRecal:
      out.normalize = local;
      out.running = RunningUpdate::kFromBatch;
      break;
  }
  return out;
}

absl::StatusOr<BnForwardOutcome> WorkerBn::Forward(
    const std::function<absl::StatusOr<PsClient*>()>& get_client,
    const std::string& layer, int64_t step, const bn::Moments& local,
    const std::optional<LayerRunning>& running, bool* exchanged) const {
  const bool tracks = running.has_value();
  if (tracks && (running->batches_tracked == nullptr ||
                 running->stats == nullptr)) {
    return absl::InvalidArgumentError(
        "running statistics without a count of the batches they tracked");
  }
  std::optional<double> momentum;
  if (tracks) momentum = running->momentum;
  if (absl::Status s = CheckLayer(layer, tracks, momentum); !s.ok()) return s;
  const BnForwardPlan plan = PlanForward(tracks);
  std::optional<BnForwardResult> answer;
  if (plan.exchange) {
    absl::StatusOr<PsClient*> client = get_client();
    if (!client.ok()) return client.status();
    absl::StatusOr<BnForwardResult> r =
        (*client)->BnForward(layer, step, local, plan.want_running);
    if (!r.ok()) return r.status();
    if (exchanged != nullptr) *exchanged = true;
    answer = *std::move(r);
  }
  absl::StatusOr<BnForwardOutcome> out = Resolve(local, answer);
  if (!out.ok() || !tracks) return out;
  if (absl::Status s = ApplyRunning(*out, running->momentum,
                                    running->batches_tracked, running->stats);
      !s.ok()) {
    return s;
  }
  return out;
}

absl::StatusOr<RunningSettle> WorkerBn::SettleRunning() const {
  switch (policy_) {
    case policy::Policy::kSync:
      return RunningSettle::kNothing;
    case policy::Policy::kLocal:
      return RunningSettle::kWorkersAverage;
    case policy::Policy::kAsync:
      return RunningSettle::kServers;
    case policy::Policy::kRecal:
      break;
  }
  return absl::FailedPreconditionError(
      "bnps: policy recal settles the running statistics with "
      "bnps.torch.recalibrate(model, loader)");
}

absl::Status UpdateRunning(const bn::Moments& batch,
                           std::optional<double> momentum,
                           int64_t* batches_tracked,
                           bn::RunningStats* running) {
  if (batch.count == 0) return absl::OkStatus();
  if (batch.count == 1) {
    return absl::InvalidArgumentError(
        "bnps SyncBatchNorm: expected more than 1 value per channel when "
        "training (the batch it normalizes with has one)");
  }
  ++*batches_tracked;
  const double m = momentum.has_value()
                       ? *momentum
                       : 1.0 / static_cast<double>(*batches_tracked);
  absl::Status s = bn::UpdateRunningStats(batch, m, running);
  if (!s.ok()) --*batches_tracked;
  return s;
}

absl::Status ApplyRunning(const BnForwardOutcome& outcome,
                          std::optional<double> momentum,
                          int64_t* batches_tracked, bn::RunningStats* running) {
  switch (outcome.running) {
    case RunningUpdate::kNone:
      return absl::OkStatus();
    case RunningUpdate::kFromBatch:
      return UpdateRunning(outcome.normalize, momentum, batches_tracked,
                           running);
    case RunningUpdate::kFromServers:
      break;
  }
  const std::optional<bn::RunningStats>& servers = outcome.servers_running;
  if (!servers.has_value() || servers->mean.size() != running->mean.size() ||
      servers->var.size() != running->var.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the servers' running statistics are ",
        servers.has_value() ? absl::StrCat("of ", servers->mean.size(),
                                           " channels")
                            : std::string("missing"),
        ", the layer has ", running->mean.size()));
  }
  *running = *servers;
  ++*batches_tracked;
  return absl::OkStatus();
}

}  // namespace bnps::client
