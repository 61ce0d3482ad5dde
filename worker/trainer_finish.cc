// Trainer (trainer.h): the end of a run: the report's totals, the running
// statistics settled or pulled, evaluation and recalibration.

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bn/moments.h"
#include "client/worker_bn.h"
#include "policy/policy.h"
#include "nn/bn_exchange.h"
#include "nn/layers.h"
#include "worker/trainer.h"
#include "worker/trainer_internal.h"

namespace bnps::worker {

using trainer_internal::Annotate;
using trainer_internal::Seconds;
using trainer_internal::ToHost;
using trainer_internal::ToParams;

absl::Status Trainer::FinishRun(const RunState& run, TrainReport* report) {
  report->epochs = run.per_epoch > 0 ? (run.step + run.per_epoch - 1) / run.per_epoch : 0;
  report->seconds_compute = std::max(
      0.0, report->seconds_total - report->seconds_bn_sync - report->seconds_grad_sync);
  report->images_per_second = report->seconds_total > 0
                                 ? report->timed_examples / report->seconds_total
                                 : 0;
  if (!report->history.empty()) {
    report->train_loss_first = report->history.front().loss;
    report->train_loss_last = report->history.back().loss;
  }

  const absl::Time finish_start = absl::Now();
  if (client_->worker() >=
      run.members.WorkersAt(std::max<int64_t>(run.total - 1, 0))) {
    // A resized job left this worker behind before its end: its part of the
    // run is done, and the end belongs to the job's last workers.
    report->seconds_finish = Seconds(finish_start);
    return absl::OkStatus();
  }
  if (absl::Status s = SettleRunningStats(run.step); !s.ok()) return s;
  if (options_.evaluate) {
    absl::StatusOr<double> acc = Evaluate();
    if (!acc.ok()) return acc.status();
    report->test_accuracy = *acc;
    report->evals.push_back(EvalPoint{report->epochs, Seconds(run.start), *acc});
  }
  if (options_.recalibrate && policy_ != policy::Policy::kRecal) {
    if (absl::Status s = Recalibrate(); !s.ok()) return s;
    if (options_.evaluate) {
      absl::StatusOr<double> acc = Evaluate();
      if (!acc.ok()) return acc.status();
      report->test_accuracy_recal = *acc;
    }
  } else if (policy_ == policy::Policy::kRecal) {
    report->test_accuracy_recal = report->test_accuracy;
  }
  report->seconds_finish = Seconds(finish_start);
  return absl::OkStatus();
}

absl::Status Trainer::SettleRunningStats(int64_t steps) {
  // The final parameters: every update of the run applied.
  if (bulk_synchronous_) {
    if (absl::Status s = PullInto(steps); !s.ok()) {
      return Annotate(s, "pulling the final parameters");
    }
  } else {
    // Wait until every worker finished (their clocks reach `steps`), so all
    // pushes are in, then take the newest parameters.
    const int64_t s_bound = client_->config().staleness();
    if (absl::StatusOr<int64_t> c = client_->StartStep(steps + s_bound);
        !c.ok()) {
      return Annotate(c.status(), "waiting for the other workers to finish");
    }
    if (absl::Status s = PullInto(0); !s.ok()) {
      return Annotate(s, "pulling the final parameters");
    }
  }
  // How the running statistics become the job's is WorkerBn's rule: under
  // recal it refuses (FAILED_PRECONDITION), and the trainer recalibrates.
  absl::StatusOr<client::RunningSettle> settle =
      client::WorkerBn(policy_, client_->config().bn_momentum())
          .SettleRunning();
  if (absl::IsFailedPrecondition(settle.status())) return Recalibrate();
  if (!settle.ok()) return settle.status();
  switch (*settle) {
    case client::RunningSettle::kNothing:
      // sync: the layers followed the job's moments for every step they
      // trained; the servers' followed every step of the job, which a worker
      // that joined or resumed later did not see. Theirs are final.
    case client::RunningSettle::kServers:
      return PullRunningStats(steps);
    case client::RunningSettle::kWorkersAverage:
      break;
  }
  for (nn::BatchNorm* layer : model_->batch_norms()) {
    absl::StatusOr<bn::RunningStats> avg =
        client_->BnLocalRunning(layer->name(), layer->running());
    if (!avg.ok()) {
      return Annotate(avg.status(),
                      absl::StrCat("averaging running stats of ", layer->name()));
    }
    if (absl::Status s = layer->set_running(*std::move(avg)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::PullRunningStats(int64_t steps) {
  if (!policy::BnTrafficWhileTraining(policy_)) {
    return absl::OkStatus();
  }
  for (nn::BatchNorm* layer : model_->batch_norms()) {
    absl::StatusOr<bn::RunningStats> running =
        client_->BnRunning(layer->name(), layer->channels());
    if (steps == 0 && absl::IsNotFound(running.status())) continue;
    if (!running.ok()) {
      return Annotate(running.status(),
                      absl::StrCat("reading the servers' running stats of ",
                                   layer->name()));
    }
    if (absl::Status s = layer->set_running(*std::move(running)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::Recalibrate() {
  // The job's last workers recalibrate over the whole training set (a
  // resized job's others have left).
  absl::StatusOr<proto::MembershipHistory> members =
      proto::MembershipHistory::FromSegments(client_->config().num_workers(),
                                             client_->membership());
  if (!members.ok()) return Annotate(members.status(), "the job's membership");
  const int last = members->WorkersAt(std::numeric_limits<int64_t>::max());
  if (client_->worker() >= last) return absl::OkStatus();
  BatcherOptions bo = ShardOptions(proto::MembershipHistory(last));
  bo.num_workers = last;
  bo.shuffle = false;
  bo.limit = options_.recal_examples > 0 ? options_.recal_examples
                                         : options_.train_examples;
  absl::StatusOr<Batcher> batcher = Batcher::Create(train_, bo);
  if (!batcher.ok()) return batcher.status();
  const std::vector<nn::BatchNorm*>& layers = model_->batch_norms();

  // One pass over the shard: runs the model and files, for each layer in
  // `collect`, the moments of every non-empty batch.
  auto pass = [&](const std::vector<nn::BatchNorm*>& collect) -> absl::Status {
    batcher->StartEpoch(0);
    Batch batch;
    int64_t index = 0;
    while (batcher->Next(&batch)) {
      if (batch.n == 0) continue;
      if (absl::Status s = model_->Forward(batch.images.data(), batch.n);
          !s.ok()) {
        return Annotate(s, "recalibration forward");
      }
      for (nn::BatchNorm* layer : collect) {
        if (absl::Status s =
                client_->BnRecal(layer->name(), index, layer->collected());
            !s.ok()) {
          return Annotate(s, absl::StrCat("recalibrating ", layer->name()));
        }
      }
      ++index;
    }
    return absl::OkStatus();
  };
  auto finish = [&](nn::BatchNorm* layer) -> absl::Status {
    absl::StatusOr<bn::RunningStats> population =
        client_->BnRecalFinish(layer->name());
    if (!population.ok()) {
      return Annotate(population.status(),
                      absl::StrCat("recalibrating ", layer->name()));
    }
    return layer->set_running(*std::move(population));
  };

  absl::Status result = absl::OkStatus();
  if (options_.recal_mode == RecalMode::kPrecise) {
    model_->SetBnMode(nn::BnMode::kCollect);
    result = pass(layers);
    for (size_t i = 0; result.ok() && i < layers.size(); ++i) {
      result = finish(layers[i]);
    }
  } else {
    // Layer by layer: those before `i` already normalize with their new
    // population statistics.
    for (size_t i = 0; result.ok() && i < layers.size(); ++i) {
      for (size_t j = 0; j < layers.size(); ++j) {
        layers[j]->set_mode(j == i ? nn::BnMode::kCollect
                                   : nn::BnMode::kInference);
      }
      result = pass({layers[i]});
      if (result.ok()) result = finish(layers[i]);
    }
  }
  model_->SetBnMode(nn::BnMode::kTrain);
  return result;
}

absl::StatusOr<double> Trainer::Evaluate() {
  BatcherOptions bo;
  bo.batch_size = 500;
  bo.shuffle = false;
  bo.limit = options_.test_examples;
  absl::StatusOr<Batcher> batcher = Batcher::Create(test_, bo);
  if (!batcher.ok()) return batcher.status();
  model_->SetBnMode(nn::BnMode::kInference);
  batcher->StartEpoch(0);
  Batch batch;
  int64_t correct = 0, n = 0;
  absl::Status result = absl::OkStatus();
  while (result.ok() && batcher->Next(&batch)) {
    result = model_->Forward(batch.images.data(), batch.n);
    if (!result.ok()) break;
    absl::StatusOr<nn::LossResult> r = model_->Loss(batch.labels.data());
    if (!r.ok()) {
      result = r.status();
      break;
    }
    correct += r->correct;
    n += r->n;
  }
  model_->SetBnMode(nn::BnMode::kTrain);
  if (!result.ok()) return Annotate(result, "evaluating");
  if (n == 0) return absl::FailedPreconditionError("the test set is empty");
  return static_cast<double>(correct) / n;
}

}  // namespace bnps::worker
