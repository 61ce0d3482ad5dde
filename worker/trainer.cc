#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_format.h"
#include "bn/moments.h"
#include "policy/policy.h"
#include "proto/generation.h"
#include "worker/host_bn_group.h"
#include "worker/layer_pull.h"
#include "worker/replica_threads.h"
#include "nn/bn_exchange.h"
#include "worker/server_bn_exchange.h"
#include "nn/layers.h"
#include "worker/trainer_internal.h"

namespace bnps::worker {
namespace {

using trainer_internal::Annotate;
using trainer_internal::Seconds;
using trainer_internal::ToHost;
using trainer_internal::ToParams;

// The first model, then the replicas.
std::vector<nn::Model*> AllModels(nn::Model* first,
                                  const std::vector<nn::Model*>& replicas) {
  std::vector<nn::Model*> models = {first};
  models.insert(models.end(), replicas.begin(), replicas.end());
  return models;
}

}  // namespace

Trainer::Trainer(client::PsClient* client, nn::Model* model,
                 const Dataset* train, const Dataset* test,
                 TrainerOptions options)
    : client_(client),
      model_(model),
      train_(train),
      test_(test),
      options_(std::move(options)),
      models_(AllModels(model, options_.replicas)),
      job_policy_(policy::FromConfig(client->config())
                      .value_or(policy::JobPolicy{})),
      policy_(job_policy_.bn),
      bulk_synchronous_(policy::BulkSynchronous(job_policy_.gradients)) {}

BatcherOptions Trainer::ShardOptions(
    const proto::MembershipHistory& members) const {
  BatcherOptions bo;
  bo.worker = client_->worker();
  bo.num_workers = client_->num_workers();
  bo.epoch_workers = members.base_workers();
  bo.batch_size = options_.batch_size;
  bo.seed = options_.seed;
  bo.shuffle = options_.shuffle;
  bo.limit = options_.train_examples;
  return bo;
}

absl::Status Trainer::PullInto(int64_t min_version) {
  absl::StatusOr<client::Params> params =
      client_->PullParameters(min_version);
  if (!params.ok()) return params.status();
  nn::HostTensors values = ToHost(*std::move(params));
  for (nn::Model* replica : options_.replicas) {
    if (absl::Status s = replica->SetParameters(values); !s.ok()) return s;
  }
  return model_->SetParameters(std::move(values));
}

absl::StatusOr<TrainReport> Trainer::Run() {
  if (absl::Status s = CheckOptions(); !s.ok()) return s;
  RunState run;
  if (absl::Status s = RefreshMembers(&run); !s.ok()) return s;
  BatcherOptions bo = ShardOptions(run.members);
  absl::StatusOr<Batcher> batcher = Batcher::Create(train_, bo);
  if (!batcher.ok()) return batcher.status();

  TrainReport report;
  report.policy = policy::JobPolicyName(job_policy_);
  report.worker = bo.worker;
  report.num_workers = bo.num_workers;
  run.per_epoch = batcher->batches_per_epoch();
  run.total = run.per_epoch * options_.epochs;
  if (options_.max_steps > 0) run.total = std::min(run.total, options_.max_steps);
  report.steps = run.total;
  if (absl::Status s = JoinJob(&run); !s.ok()) return s;

  ServerBnExchange sync(client_, policy_, options_.metrics);
  nn::LocalBnExchange local_sync;
  nn::BnExchange* const exchange = policy::BnTrafficWhileTraining(policy_)
                                       ? static_cast<nn::BnExchange*>(&sync)
                                       : &local_sync;
  // Replicas combine their BN contributions on the host first (under local
  // and recal too: the worker's batch is the union of the slices).
  const std::vector<nn::Model*>& models = models_;
  std::optional<HostBnGroup> group;
  std::optional<ReplicaThreads> replica_threads;
  if (models.size() > 1) {
    group.emplace(static_cast<int>(models.size()), exchange);
    group_ = &*group;
    replica_threads.emplace(static_cast<int>(models.size()),
                            options_.on_replica_thread);
    replica_threads_ = &*replica_threads;
  }
  for (size_t i = 0; i < models.size(); ++i) {
    models[i]->SetBnExchange(group ? group->member(static_cast<int>(i))
                                   : exchange);
    models[i]->SetBnMode(nn::BnMode::kTrain);
  }
  // However Run ends, no model keeps a pointer to the exchanges above.
  struct Detach {
    Trainer* t;
    ~Detach() {
      for (nn::Model* m : t->models_) m->SetBnExchange(nullptr);
      t->group_ = nullptr;
      t->replica_threads_ = nullptr;
      t->layer_pull_ = nullptr;
    }
  } detach{this};
  std::optional<LayerPull> layer_pull;
  if (bulk_synchronous_ && options_.layer_pull) {
    layer_pull.emplace(client_, *model_);
    layer_pull_ = &*layer_pull;
  }
  // The BN backward overlap needs the exchange's StartBackward, which the
  // host's group runs in place: with replicas it is off.
  model_->SetBackwardOverlap(options_.overlap_bn && models.size() == 1);

  run.start = absl::Now();
  if (absl::Status s = TrainSteps(&*batcher, &sync, &run, &report); !s.ok()) {
    return s;
  }
  if (absl::Status s = FinishRun(run, &report); !s.ok()) return s;
  model_->SetBnExchange(nullptr);
  return report;
}

absl::Status Trainer::CheckOptions() const {
  if (options_.batch_size < 1 || options_.epochs < 1 || options_.max_steps < 0 ||
      options_.train_examples < 0 || options_.test_examples < 0 ||
      options_.recal_examples < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad training options: batch_size ", options_.batch_size, ", epochs ",
        options_.epochs, ", max_steps ", options_.max_steps));
  }
  for (size_t r = 0; r < options_.replicas.size(); ++r) {
    const nn::Model* replica = options_.replicas[r];
    if (replica == nullptr || replica == model_ ||
        std::count(options_.replicas.begin(), options_.replicas.end(),
                   replica) > 1) {
      return absl::InvalidArgumentError(
          "a replica is null, the first model itself or listed twice");
    }
    // The same layers in the same order, or the host's BN rounds would pair
    // different layers.
    const std::vector<nn::Parameter*>& want = model_->parameters();
    const std::vector<nn::Parameter*>& got = replica->parameters();
    bool same = want.size() == got.size();
    for (size_t i = 0; same && i < want.size(); ++i) {
      same = want[i]->name == got[i]->name && want[i]->dims == got[i]->dims;
    }
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replica ", r + 1, " is not the same model as the first (",
          got.size(), " parameters against ", want.size(),
          "): build every replica with the same options"));
    }
  }
  if (options_.evaluate && test_ == nullptr) {
    return absl::InvalidArgumentError("evaluation needs a test set");
  }
  if (absl::StatusOr<policy::JobPolicy> p =
          policy::FromConfig(client_->config());
      !p.ok()) {
    return Annotate(p.status(), "the job's config");
  }
  return absl::OkStatus();
}

absl::Status Trainer::JoinJob(RunState* run) {
  // The first initialization of a key wins, so every worker may offer its
  // (identical) initial values. A restarted worker brings the job back to a
  // checkpoint it can join at; so does a worker that finds a server
  // restarted.
  bool rejoin = client_->rejoining();
  for (;;) {
    absl::Status s = client_->InitParameters(
        ToParams(model_->InitialParameters(options_.seed)));
    if (s.ok() && rejoin) s = absl::AbortedError(proto::kRollsBackText);
    if (s.ok()) break;
    if (!(proto::IsRollback(s) || absl::IsUnavailable(s)) ||
        run->recoveries >= kMaxRecoveries) {
      return Annotate(s, "initializing the parameters");
    }
    absl::StatusOr<int64_t> k = client_->Recover(rejoin);
    if (!k.ok()) return Annotate(k.status(), "joining the job");
    ++run->recoveries;
    rejoin = false;
    run->step = std::min(*k, run->total);
  }
  if (absl::Status s = RefreshMembers(run); !s.ok()) return s;
  // No step to come counts this worker: it asks the job to take it (a sync
  // job grows from a step every server has a checkpoint of). Workers that
  // ask at once may find the rollback decided by another's request: ask
  // again.
  constexpr int kJoinAttempts = 10;
  for (int attempt = 0;
       client_->worker() >= run->members.MaxWorkersFrom(run->step);
       ++attempt) {
    if (attempt == kJoinAttempts) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job did not take worker ", client_->worker(), " after ",
          kJoinAttempts, " requests (membership ", run->members.ToString(),
          ")"));
    }
    absl::StatusOr<int64_t> k = client_->Join();
    if (!k.ok()) return Annotate(k.status(), "joining the job");
    ++run->recoveries;
    run->step = std::min(*k, run->total);
    if (absl::Status s = RefreshMembers(run); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Trainer::RefreshMembers(RunState* run) const {
  absl::StatusOr<proto::MembershipHistory> members =
      proto::MembershipHistory::FromSegments(client_->config().num_workers(),
                                             client_->membership());
  if (!members.ok()) return Annotate(members.status(), "the job's membership");
  run->members = *std::move(members);
  return absl::OkStatus();
}

absl::Status Trainer::LeaveEarly(RunState* run) {
  // A planned leave: the job goes on without this worker from a
  // checkpoint step, which this worker then skips to the end.
  absl::StatusOr<int64_t> k = client_->LeaveEarly();
  if (!k.ok()) return Annotate(k.status(), "leaving the job early");
  ++run->recoveries;
  run->step = std::min(*k, run->total);
  return RefreshMembers(run);
}

absl::Status Trainer::AwaitFirstStep(int64_t step) {
  // A worker that joins the job later waits for its first step as long
  // as the others take to reach it, not one barrier's deadline.
  absl::Status s;
  while (absl::IsDeadlineExceeded(s = PullInto(step))) {
  }
  if (!s.ok() && !proto::IsRollback(s) && !absl::IsUnavailable(s)) {
    return Annotate(s, absl::StrCat("waiting for step ", step,
                                    ", this worker's first"));
  }
  return absl::OkStatus();
}

absl::Status Trainer::RecoverFromStep(const absl::Status& s, RunState* run) {
  // A server restarted (or a worker, under --on_worker_loss=wait): the
  // job rolls back to a checkpoint and this worker goes on from there.
  // A server out of reach past the retries (restarting, or behind a
  // partition) leaves this step unfinishable: the job rolls back too.
  if ((proto::IsRollback(s) || absl::IsUnavailable(s)) &&
      run->recoveries < kMaxRecoveries) {
    absl::StatusOr<int64_t> k = client_->Recover(
        /*restarted=*/absl::IsUnavailable(s) && !proto::IsRollback(s));
    if (k.ok()) {
      ++run->recoveries;
      run->step = std::min(*k, run->total);
      // A rollback may have resized the job (a worker joined).
      return RefreshMembers(run);
    }
    if (!absl::IsUnimplemented(k.status())) {
      return absl::Status(
          s.code(), absl::StrCat(s.message(), "; rolling the job back: ",
                                 k.status().message()));
    }
  }
  return s;
}

void Trainer::CountStep(int64_t step, const StepFigures& f, int64_t n,
                        absl::Duration took, TrainReport* report) const {
  report->max_staleness = std::max(report->max_staleness, f.staleness);
  if (step >= options_.timing_warmup_steps) {
    report->seconds_total += absl::ToDoubleSeconds(took);
    report->seconds_bn_sync += absl::ToDoubleSeconds(f.bn_time);
    report->seconds_grad_sync += absl::ToDoubleSeconds(f.grad_time);
    report->timed_examples += n;
    ++report->timed_steps;
  }
  if (options_.metrics != nullptr) {
    options_.metrics->StepDone(
        std::max(absl::ZeroDuration(), took - f.bn_time - f.grad_time),
        f.bn_time, f.grad_time, n);
  }
  report->examples += n;
}

void Trainer::ReportProgress(const RunState& run, int64_t epoch,
                             int64_t staleness, Window* prog,
                             double* prog_start) const {
  const double now = Seconds(run.start);
  Progress p;
  p.step = run.step;
  p.total_steps = run.total;
  p.epoch = epoch;
  p.loss = prog->n > 0 ? prog->loss / prog->n : 0;
  p.accuracy = prog->n > 0 ? static_cast<double>(prog->correct) / prog->n : 0;
  p.images_per_second = now > *prog_start ? prog->n / (now - *prog_start) : 0;
  p.staleness = staleness;
  p.seconds = now;
  options_.on_progress(p);
  *prog_start = now;
  *prog = Window();
}

absl::Status Trainer::EvaluateEpoch(const RunState& run, int64_t epoch,
                                    TrainReport* report) {
  // Parameters as of this worker's last pull; sync and async take the
  // servers' running stats as they are now. A progress figure, not the
  // final result.
  if (absl::Status s = PullRunningStats(run.step); !s.ok()) return s;
  absl::StatusOr<double> acc = Evaluate();
  if (!acc.ok()) return acc.status();
  report->evals.push_back(EvalPoint{epoch + 1, Seconds(run.start), *acc});
  return absl::OkStatus();
}

absl::Status Trainer::TrainSteps(Batcher* batcher, ServerBnExchange* sync,
                                 RunState* run, TrainReport* report) {
  const int64_t history_every = std::max<int64_t>(1, run->total / 50);
  absl::Time last_progress = run->start;
  // Figures since the last history point / progress report.
  Window hist, prog;
  int64_t staleness = 0;
  double prog_start = 0;
  Batch batch;
  int64_t positioned = -1;  // the step the batcher's next batch is of
  bool skipped = false, left = false;
  while (run->step < run->total) {
    const int members = run->members.WorkersAt(run->step);
    if (options_.leave_at_step > 0 && !left &&
        run->step >= options_.leave_at_step &&
        batcher->options().worker < members) {
      left = true;
      positioned = -1;
      if (absl::Status s = LeaveEarly(run); !s.ok()) return s;
      continue;
    }
    if (batcher->options().worker >= members) {
      // Not one of this step's workers (a resized job): the others train it.
      ++run->step;
      skipped = true;
      continue;
    }
    if (skipped) {
      skipped = false;
      if (absl::Status s = AwaitFirstStep(run->step); !s.ok()) return s;
    }
    const int64_t epoch = run->per_epoch > 0 ? run->step / run->per_epoch : 0;
    if (positioned != run->step || batcher->step() == run->per_epoch) {
      // The sampler is deterministic in (seed, epoch, step): a resumed step
      // sees the batch it saw before.
      batcher->StartEpoch(epoch);
      for (int64_t i = epoch * run->per_epoch; i < run->step; ++i) {
        batcher->Next(&batch);
      }
      positioned = run->step;
    }
    if (absl::Status s = batcher->SetNumWorkers(members); !s.ok()) return s;
    if (!batcher->Next(&batch)) break;
    ++positioned;
    StepFigures f;
    const absl::Time step_start = absl::Now();
    if (absl::Status s = TrainStep(run->step, batch, sync, &f); !s.ok()) {
      if (absl::Status r = RecoverFromStep(s, run); !r.ok()) return r;
      positioned = -1;
      continue;
    }
    staleness = f.staleness;
    const absl::Time step_end = absl::Now();
    CountStep(run->step, f, batch.n, step_end - step_start, report);
    for (Window* w : {&hist, &prog}) {
      w->loss += f.loss_sum;
      w->correct += f.correct;
      w->n += batch.n;
    }
    ++run->step;

    if (run->step % history_every == 0 || run->step == run->total) {
      if (hist.n > 0) {
        report->history.push_back(HistoryPoint{
            run->step, Seconds(run->start), hist.loss / hist.n,
            static_cast<double>(hist.correct) / hist.n});
      }
      hist = Window();
    }
    const bool epoch_end = batcher->step() == run->per_epoch || run->step == run->total;
    if (options_.on_progress &&
        (epoch_end || step_end - last_progress >= options_.progress_interval)) {
      ReportProgress(*run, epoch, staleness, &prog, &prog_start);
      last_progress = step_end;
    }
    if (batcher->step() == run->per_epoch && options_.evaluate &&
        options_.eval_every_epoch && epoch + 1 < options_.epochs &&
        run->step < run->total) {
      if (absl::Status s = EvaluateEpoch(*run, epoch, report); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::TrainStep(int64_t step, const Batch& batch,
                               ServerBnExchange* sync, StepFigures* f) {
  const absl::Time step_start = absl::Now();
  // async gradients: wait until the bound allows this step.
  if (!bulk_synchronous_) {
    absl::StatusOr<int64_t> min_clock = client_->StartStep(step);
    if (!min_clock.ok()) return Annotate(min_clock.status(), "step start");
    f->staleness = step - *min_clock;
  }
  const std::string pulling = absl::StrCat("step ", step, ": pulling parameters");
  if (layer_pull_ != nullptr) {
    layer_pull_->Start(step);
  } else if (absl::Status s = PullInto(bulk_synchronous_ ? step : 0);
             !s.ok()) {
    return Annotate(s, pulling);
  }
  f->grad_time += absl::Now() - step_start;
  sync->set_step(step);
  sync->reset_elapsed();
  absl::Duration pull_wait;
  const absl::Status computed = ComputeAndPush(step, batch, f, &pull_wait);
  f->grad_time += pull_wait;
  if (layer_pull_ != nullptr) {
    if (!computed.ok()) {
      // A pass that stopped for want of parameters failed in the pull.
      layer_pull_->Stop();
      const absl::Status pull_error = layer_pull_->error();
      return pull_error.ok() ? computed : Annotate(pull_error, pulling);
    }
    // Every key is in (the passes waited for each): this only collects the
    // calls' ends.
    const absl::Time finish_start = absl::Now();
    const absl::Status pulled = layer_pull_->Finish();
    f->grad_time += absl::Now() - finish_start;
    if (!pulled.ok()) return Annotate(pulled, pulling);
  }
  if (!computed.ok()) return computed;
  const absl::Time push_start = absl::Now();
  if (!bulk_synchronous_) {
    if (absl::Status s = client_->FinishStep(step + 1); !s.ok()) {
      return Annotate(s, absl::StrCat("step ", step, ": finishing"));
    }
  }
  f->grad_time += absl::Now() - push_start;
  f->bn_time = sync->elapsed();
  return absl::OkStatus();
}

absl::Status Trainer::ComputeAndPush(int64_t step, const Batch& batch,
                                     StepFigures* f,
                                     absl::Duration* pull_wait) {
  if (!options_.replicas.empty()) {
    // Replicas: their gradients are summed on the host, then pushed once.
    absl::StatusOr<nn::HostTensors> grads = Compute(step, batch, f, pull_wait);
    if (!grads.ok()) return grads.status();
    return Push(step, batch.n, *std::move(grads), f);
  }
  if (absl::Status s = model_->Forward(batch.images.data(), batch.n,
                                       PullHook(model_, pull_wait));
      !s.ok()) {
    return Annotate(s, absl::StrCat("step ", step, ": forward"));
  }
  absl::StatusOr<nn::LossResult> loss = model_->Loss(batch.labels.data());
  if (!loss.ok()) return Annotate(loss.status(), absl::StrCat("step ", step));
  f->loss_sum = loss->loss_sum;
  f->correct = loss->correct;
  return options_.overlap ? BackwardAndPush(step, batch.n, f)
                          : BackwardThenPush(step, batch.n, f);
}

nn::Model::ParametersNeeded Trainer::PullHook(nn::Model* m,
                                              absl::Duration* waited) {
  if (layer_pull_ == nullptr) return nullptr;
  return layer_pull_->Hook(m, waited);
}

absl::StatusOr<nn::HostTensors> Trainer::Compute(int64_t step,
                                                 const Batch& batch,
                                                 StepFigures* f,
                                                 absl::Duration* pull_wait) {
  const std::vector<nn::Model*>& models = models_;
  const int k = static_cast<int>(models.size());
  const int64_t per_image = batch.channels * batch.height * batch.width;
  struct Part {
    absl::Status status;
    nn::LossResult loss;
    absl::StatusOr<nn::HostTensors> grads = absl::UnknownError("not run");
  };
  std::vector<Part> parts(k);
  // Replica i takes the examples [n*i/k, n*(i+1)/k).
  auto run = [&](int i) {
    const int64_t lo = batch.n * i / k, hi = batch.n * (i + 1) / k;
    nn::Model* m = models[i];
    Part& p = parts[i];
    // The first model runs on this thread: its waits are the step's.
    p.status = m->Forward(batch.images.data() + lo * per_image, hi - lo,
                          PullHook(m, i == 0 ? pull_wait : nullptr));
    if (!p.status.ok()) {
      p.status = Annotate(p.status, absl::StrCat("step ", step, ": forward"));
    } else if (absl::StatusOr<nn::LossResult> loss =
                   m->Loss(batch.labels.data() + lo);
               !loss.ok()) {
      p.status = Annotate(loss.status(), absl::StrCat("step ", step));
    } else {
      p.loss = *loss;
      p.status = m->Backward();
      if (!p.status.ok()) {
        p.status = Annotate(p.status, absl::StrCat("step ", step, ": backward"));
      } else {
        p.grads = m->Gradients();
        p.status = p.grads.status();
      }
    }
    // A replica that stops must not leave the others waiting at the host's
    // BN barrier.
    if (!p.status.ok()) group_->Abort(p.status);
  };
  // A new step, perhaps after a failed one and a recovery: no replica is
  // inside the group now.
  group_->Reset();
  replica_threads_->Run(run);
  // The first failure in replica order (an Abort's echo in the others).
  for (Part& p : parts) {
    if (!p.status.ok() && !absl::IsCancelled(p.status)) return p.status;
  }
  for (Part& p : parts) {
    if (!p.status.ok()) return p.status;
  }
  nn::HostTensors sum = *std::move(parts[0].grads);
  for (int i = 1; i < k; ++i) {
    for (auto& [name, t] : sum) {
      const nn::HostTensor& add = parts[i].grads->at(name);
      for (size_t j = 0; j < t.values.size(); ++j) t.values[j] += add.values[j];
    }
  }
  for (const Part& p : parts) {
    f->loss_sum += p.loss.loss_sum;
    f->correct += p.loss.correct;
  }
  return sum;
}

absl::Status Trainer::BackwardThenPush(int64_t step, int64_t n,
                                       StepFigures* f) {
  if (absl::Status s = model_->Backward(); !s.ok()) {
    return Annotate(s, absl::StrCat("step ", step, ": backward"));
  }
  absl::StatusOr<nn::HostTensors> grads = model_->Gradients();
  if (!grads.ok()) return grads.status();
  return Push(step, n, *std::move(grads), f);
}

absl::Status Trainer::Push(int64_t step, int64_t n, nn::HostTensors grads,
                           StepFigures* f) {
  const absl::Time push_start = absl::Now();
  absl::Status s = client_->PushGradients(
      step, n, std::make_shared<const client::Params>(ToParams(std::move(grads))));
  f->grad_time += absl::Now() - push_start;
  return Annotate(s, absl::StrCat("step ", step, ": pushing gradients"));
}

absl::Status Trainer::BackwardAndPush(int64_t step, int64_t n,
                                      StepFigures* f) {
  std::unique_ptr<client::GradientPush> push = client_->StartPush(step, n);
  absl::Status backward = model_->Backward(
      [&](absl::Span<const nn::Parameter* const> params) -> absl::Status {
        absl::StatusOr<nn::HostTensors> grads = model_->Gradients(params);
        if (!grads.ok()) return grads.status();
        push->Add(std::make_shared<const client::Params>(
            ToParams(*std::move(grads))));
        return absl::OkStatus();
      });
  const absl::Time wait_start = absl::Now();
  if (!backward.ok()) {
    // A failed pass sends no more of its step (the parts held are dropped)
    // and waits for the sends in flight: none is left when the step fails.
    push->Abandon();
    f->grad_time += absl::Now() - wait_start;
    return Annotate(backward, absl::StrCat("step ", step, ": backward"));
  }
  absl::Status pushed = push->Finish();
  f->grad_time += absl::Now() - wait_start;
  return Annotate(pushed, absl::StrCat("step ", step, ": pushing gradients"));
}

}  // namespace bnps::worker
