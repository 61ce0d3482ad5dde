// The training loop (worker/trainer.h) over the in-process client: what it
// asks of the servers under each policy, what state it leaves on them, and
// how it fails -- with no server process and no socket.

#include "worker/trainer.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "client/in_process_client.h"
#include "worker/training_testing.h"
#include "worker/data/synthetic.h"
#include "nn/cpu_backend.h"
#include "nn/model.h"

namespace bnps {
namespace {

using ::testing::HasSubstr;
using worker::Dataset;
using worker::TrainerOptions;
using worker::TrainReport;

// Delegates to an InProcessPsClient, records every call as a line
// ("pull 3", "fwd stem.bn 3", ...) and can fail one push. A step's pushes in
// parts (StartPush) are collected into one "push s n=..." unless
// ForwardParts() was called: then they go to the inner client part by part,
// recorded as "part s <its keys, comma-separated>" and "push_done s".
class RecordingClient final : public client::PsClient {
 public:
  explicit RecordingClient(std::unique_ptr<client::PsClient> inner)
      : inner_(std::move(inner)), config_(inner_->config()) {}

  void FailPushAt(int64_t step, absl::Status why) {
    fail_step_ = step;
    fail_ = std::move(why);
  }
  void ForwardParts() { forward_parts_ = true; }
  // Records each ParameterPull::Wait as "wait <key>" (one model only: the
  // record is not locked).
  void RecordWaits() { record_waits_ = true; }

  std::unique_ptr<client::ParameterPull> StartPull(
      int64_t v, const std::vector<std::string>& keys,
      client::Params* into) override {
    std::unique_ptr<client::ParameterPull> pull =
        PsClient::StartPull(v, keys, into);
    if (!record_waits_) return pull;
    return std::make_unique<RecordedPull>(this, std::move(pull));
  }
  // With ForwardParts: part `index` (0-based) of `step`'s push is not
  // passed on, and the push fails with `why`.
  void FailPartAt(int64_t step, int index, absl::Status why) {
    fail_part_step_ = step;
    fail_part_ = index;
    fail_ = std::move(why);
  }

  std::unique_ptr<client::GradientPush> StartPush(int64_t step,
                                                  int64_t n) override {
    if (!forward_parts_) return PsClient::StartPush(step, n);
    return std::make_unique<ForwardedPush>(this, step,
                                           inner_->StartPush(step, n));
  }
  proto::JobConfig* mutable_config() { return &config_; }
  const std::vector<std::string>& calls() const { return calls_; }

  const proto::JobConfig& config() const override { return config_; }
  int worker() const override { return inner_->worker(); }
  int num_workers() const override { return inner_->num_workers(); }
  absl::Status InitParameters(const client::Params& p) override {
    calls_.push_back("init");
    return inner_->InitParameters(p);
  }
  absl::Status PushGradients(int64_t step, int64_t n,
                             const client::Params& g) override {
    calls_.push_back(absl::StrCat("push ", step, " n=", n));
    if (step == fail_step_) return fail_;
    return inner_->PushGradients(step, n, g);
  }
  absl::Status PushGradients(
      int64_t step, int64_t n,
      std::shared_ptr<const client::Params> g) override {
    return PushGradients(step, n, *g);
  }
  absl::Status PullParametersInto(int64_t v, client::Params* p) override {
    calls_.push_back(absl::StrCat("pull ", v));
    return inner_->PullParametersInto(v, p);
  }
  absl::StatusOr<client::BnForwardResult> BnForward(
      const std::string& layer, int64_t step, const bn::Moments& local,
      bool want_running) override {
    calls_.push_back(absl::StrCat("fwd ", layer, " ", step));
    return inner_->BnForward(layer, step, local, want_running);
  }
  absl::StatusOr<bn::BackwardSums> BnBackward(
      const std::string& layer, int64_t step,
      const bn::BackwardSums& local) override {
    calls_.push_back(absl::StrCat("bwd ", layer, " ", step));
    return inner_->BnBackward(layer, step, local);
  }
  absl::Status BnRecal(const std::string& layer, int64_t batch,
                       const bn::Moments& m) override {
    calls_.push_back(absl::StrCat("recal ", layer));
    return inner_->BnRecal(layer, batch, m);
  }
  absl::StatusOr<bn::RunningStats> BnRecalFinish(
      const std::string& layer) override {
    calls_.push_back(absl::StrCat("recal_finish ", layer));
    return inner_->BnRecalFinish(layer);
  }
  absl::StatusOr<bn::RunningStats> BnLocalRunning(
      const std::string& layer, const bn::RunningStats& r) override {
    calls_.push_back(absl::StrCat("local_running ", layer));
    return inner_->BnLocalRunning(layer, r);
  }
  absl::StatusOr<bn::RunningStats> BnRunning(const std::string& layer,
                                             int64_t channels) override {
    calls_.push_back(absl::StrCat("running ", layer));
    return inner_->BnRunning(layer, channels);
  }
  absl::StatusOr<int64_t> StartStep(int64_t step) override {
    calls_.push_back(absl::StrCat("start ", step));
    return inner_->StartStep(step);
  }
  absl::Status FinishStep(int64_t completed) override {
    calls_.push_back(absl::StrCat("finish ", completed));
    return inner_->FinishStep(completed);
  }
  std::vector<int> LiveWorkers() const override {
    return inner_->LiveWorkers();
  }

 private:
  const std::unique_ptr<client::PsClient> inner_;
  proto::JobConfig config_;
  // Records and passes on each part (one may be failed: FailPartAt).
  class ForwardedPush final : public client::GradientPush {
   public:
    ForwardedPush(RecordingClient* c, int64_t step,
                  std::unique_ptr<client::GradientPush> inner)
        : c_(c), step_(step), inner_(std::move(inner)) {}
    void Add(std::shared_ptr<const client::Params> part) override {
      std::vector<std::string> keys;
      for (const auto& [key, _] : *part) keys.push_back(key);
      c_->calls_.push_back(
          absl::StrCat("part ", step_, " ", absl::StrJoin(keys, ",")));
      if (step_ == c_->fail_part_step_ && parts_++ == c_->fail_part_) {
        failed_ = true;
        return;
      }
      inner_->Add(std::move(part));
    }
    absl::Status Finish() override {
      absl::Status s = inner_->Finish();
      c_->calls_.push_back(absl::StrCat("push_done ", step_));
      return failed_ ? c_->fail_ : s;
    }
    void Abandon() override {
      inner_->Abandon();
      c_->calls_.push_back(absl::StrCat("push_abandoned ", step_));
    }

   private:
    RecordingClient* const c_;
    const int64_t step_;
    const std::unique_ptr<client::GradientPush> inner_;
    int parts_ = 0;
    bool failed_ = false;
  };

  class RecordedPull final : public client::ParameterPull {
   public:
    RecordedPull(RecordingClient* c,
                 std::unique_ptr<client::ParameterPull> inner)
        : c_(c), inner_(std::move(inner)) {}
    absl::Status Wait(const std::string& key) override {
      c_->calls_.push_back(absl::StrCat("wait ", key));
      return inner_->Wait(key);
    }
    absl::Status Finish() override { return inner_->Finish(); }

   private:
    RecordingClient* const c_;
    const std::unique_ptr<client::ParameterPull> inner_;
  };

  std::vector<std::string> calls_;
  bool record_waits_ = false;
  int64_t fail_step_ = -1;
  int64_t fail_part_step_ = -1;
  int fail_part_ = -1;
  bool forward_parts_ = false;
  absl::Status fail_;
};

struct WorkerRun {
  absl::StatusOr<TrainReport> report = absl::UnknownError("not run");
  std::vector<std::string> calls;
  nn::HostTensors params;
  std::vector<bn::RunningStats> running;
  std::vector<std::string> bn_layers;  // in model order
};

server::ShardOptions JobOptions(policy::Policy p, int workers,
                                int64_t staleness = 0) {
  server::ShardOptions o;
  o.num_workers = workers;
  o.policy = p;
  o.staleness = staleness;
  o.optimizer.learning_rate = 0.05;
  o.barrier_timeout = absl::Seconds(30);
  return o;
}

// One Trainer per dataset, each on its own thread and client; `tweak` may
// change a worker's client before it trains.
// `replica_models` (empty: none) are the options of each worker's extra
// model replicas (TrainerOptions::replicas), each on its own CPU backend.
std::vector<WorkerRun> Train(
    test::InProcessJob* job, const std::vector<const Dataset*>& data,
    const TrainerOptions& options,
    const std::function<void(int, RecordingClient*)>& tweak = nullptr,
    const std::vector<nn::ModelOptions>& replica_models = {}) {
  std::vector<WorkerRun> runs(data.size());
  std::vector<std::thread> threads;
  for (size_t w = 0; w < data.size(); ++w) {
    threads.emplace_back([&, w] {
      WorkerRun& run = runs[w];
      auto inner = test::InProcessPsClient::Connect(job, w);
      if (!inner.ok()) {
        run.report = inner.status();
        return;
      }
      RecordingClient client(*std::move(inner));
      if (tweak) tweak(w, &client);
      std::unique_ptr<nn::Backend> backend = nn::NewCpuBackend();
      auto model = nn::Model::Create(test::SmallModel(), backend.get());
      if (!model.ok()) {
        run.report = model.status();
        return;
      }
      std::vector<std::unique_ptr<nn::Backend>> replica_backends;
      std::vector<std::unique_ptr<nn::Model>> replicas;
      TrainerOptions with_replicas = options;
      for (const nn::ModelOptions& mo : replica_models) {
        replica_backends.push_back(nn::NewCpuBackend());
        auto replica = nn::Model::Create(mo, replica_backends.back().get());
        if (!replica.ok()) {
          run.report = replica.status();
          return;
        }
        replicas.push_back(*std::move(replica));
        with_replicas.replicas.push_back(replicas.back().get());
      }
      worker::Trainer trainer(&client, model->get(), data[w], data[w],
                              with_replicas);
      run.report = trainer.Run();
      run.calls = client.calls();
      for (const nn::Parameter* p : (*model)->parameters()) {
        run.params[p->name] = nn::HostTensor{p->dims, p->host};
      }
      for (const nn::BatchNorm* bn : (*model)->batch_norms()) {
        run.running.push_back(bn->running());
        run.bn_layers.push_back(bn->name());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

// The calls from the first one equal to `first` up to, not including, the
// next one equal to `next` (to the end if there is none).
std::vector<std::string> CallsOf(const std::vector<std::string>& calls,
                                 const std::string& first, const std::string& next) {
  std::vector<std::string> out;
  bool in = false;
  for (const std::string& c : calls) {
    if (c == first) in = true;
    if (in && !out.empty() && c == next) break;
    if (in) out.push_back(c);
  }
  return out;
}

TrainerOptions ThreeSteps() {
  TrainerOptions o;
  o.batch_size = 4;
  o.max_steps = 3;
  o.shuffle = false;
  o.test_examples = 16;
  return o;
}

// sync: per step, the pull of that step's version, one forward exchange per
// BN layer in model order, one backward exchange per BN layer in reverse
// order, then the push; afterwards the servers' running statistics.
TEST(TrainerTest, SyncStepExchangesEveryLayerBothWays) {
  const Dataset data = worker::MakeSyntheticDataset(48, 12, 12, 10, 1);
  auto job = test::InProcessJob::Create(JobOptions(policy::Policy::kSync, 2), 2);
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<WorkerRun> runs = Train(job->get(), {&data, &data}, ThreeSteps());
  for (const WorkerRun& run : runs) {
    ASSERT_TRUE(run.report.ok()) << run.report.status();
    EXPECT_EQ(run.report->policy, "sync");
    EXPECT_EQ(run.report->steps, 3);
    EXPECT_EQ(run.report->examples, 12);
    ASSERT_TRUE(run.report->test_accuracy.has_value());
    std::vector<std::string> want = {"pull 1"};
    for (const std::string& l : run.bn_layers) want.push_back("fwd " + l + " 1");
    for (auto l = run.bn_layers.rbegin(); l != run.bn_layers.rend(); ++l) {
      want.push_back("bwd " + *l + " 1");
    }
    want.push_back("push 1 n=4");
    EXPECT_EQ(CallsOf(run.calls, "pull 1", "pull 2"), want);
    // The final parameters (version 3), then the servers' statistics.
    std::vector<std::string> after = CallsOf(run.calls, "pull 3", "");
    ASSERT_GE(after.size(), 2u);
    EXPECT_EQ(after[1], "running " + run.bn_layers[0]);
  }
  // Bulk-synchronous: every worker ends with the servers' parameters, the
  // update of each of the 3 steps applied once.
  EXPECT_EQ(runs[0].params.at("stem.conv.w").values,
            runs[1].params.at("stem.conv.w").values);
  EXPECT_EQ(runs[0].running[0].mean, runs[1].running[0].mean);
  for (int s = 0; s < 2; ++s) {
    store::ParameterStore::Stats stats = (*job)->shard(s).store().GetStats();
    EXPECT_EQ(stats.min_version, 3) << "shard " << s;
  }
}

// async: each step is bracketed by the clocks, pulls the newest parameters,
// exchanges forward statistics only, and every push is applied on arrival.
TEST(TrainerTest, AsyncStepUsesClocksAndNoBackwardExchange) {
  const Dataset data = worker::MakeSyntheticDataset(48, 12, 12, 10, 2);
  auto job = test::InProcessJob::Create(
      JobOptions(policy::Policy::kAsync, 2, /*staleness=*/1), 1);
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<WorkerRun> runs = Train(job->get(), {&data, &data}, ThreeSteps());
  for (const WorkerRun& run : runs) {
    ASSERT_TRUE(run.report.ok()) << run.report.status();
    EXPECT_EQ(run.report->policy, "async");
    EXPECT_LE(run.report->max_staleness, 1);
    std::vector<std::string> want = {"start 1", "pull 0"};
    for (const std::string& l : run.bn_layers) want.push_back("fwd " + l + " 1");
    want.push_back("push 1 n=4");
    want.push_back("finish 2");
    EXPECT_EQ(CallsOf(run.calls, "start 1", "start 2"), want);
    for (const std::string& c : run.calls) EXPECT_THAT(c, Not(HasSubstr("bwd")));
  }
  // 2 workers x 3 steps, each push its own update.
  EXPECT_EQ((*job)->shard(0).store().GetStats().min_version, 6);
}

// local and recal: no BN traffic while training; local averages the
// workers' running statistics at the end, recal recomputes them from every
// worker's data.
TEST(TrainerTest, LocalAndRecalTrainWithoutBnTrafficAndSettleAfterwards) {
  const Dataset data = worker::MakeSyntheticDataset(48, 12, 12, 10, 3);
  for (policy::Policy p : {policy::Policy::kLocal, policy::Policy::kRecal}) {
    SCOPED_TRACE(policy::PolicyName(p));
    auto job = test::InProcessJob::Create(JobOptions(p, 2), 2);
    ASSERT_TRUE(job.ok()) << job.status();
    std::vector<WorkerRun> runs =
        Train(job->get(), {&data, &data}, ThreeSteps());
    for (const WorkerRun& run : runs) {
      ASSERT_TRUE(run.report.ok()) << run.report.status();
      EXPECT_EQ(run.report->policy, policy::PolicyName(p));
      EXPECT_EQ(CallsOf(run.calls, "pull 1", "pull 2"),
                (std::vector<std::string>{"pull 1", "push 1 n=4"}));
      const std::string settle = p == policy::Policy::kLocal
                                     ? "local_running " + run.bn_layers[0]
                                     : "recal_finish " + run.bn_layers[0];
      EXPECT_THAT(run.calls, ::testing::Contains(settle));
      if (p == policy::Policy::kRecal) {
        EXPECT_EQ(run.report->test_accuracy_recal, run.report->test_accuracy);
      }
    }
    for (size_t l = 0; l < runs[0].running.size(); ++l) {
      EXPECT_EQ(runs[0].running[l].mean, runs[1].running[l].mean);
      EXPECT_EQ(runs[0].running[l].var, runs[1].running[l].var);
    }
  }
}

// The central invariant through the trainer, without sockets: under sync,
// 2 workers of batch b end where 1 worker of batch 2b does, when its data
// holds both workers' batches of each step.
TEST(TrainerTest, SyncTwoWorkersFollowOneWorkerWithTheConcatenatedBatch) {
  const int64_t b = 4, steps = 2;
  const Dataset all = worker::MakeSyntheticDataset(2 * b * steps, 12, 12, 10, 7);
  const Dataset single = test::Interleaved(all, b, steps);
  TrainerOptions two;
  two.batch_size = b;
  two.shuffle = false;
  two.max_steps = steps;
  two.evaluate = false;
  TrainerOptions one = two;
  one.batch_size = 2 * b;
  auto split_job = test::InProcessJob::Create(JobOptions(policy::Policy::kSync, 2), 2);
  auto whole_job = test::InProcessJob::Create(JobOptions(policy::Policy::kSync, 1), 2);
  ASSERT_TRUE(split_job.ok() && whole_job.ok());
  std::vector<WorkerRun> split = Train(split_job->get(), {&all, &all}, two);
  std::vector<WorkerRun> whole = Train(whole_job->get(), {&single}, one);
  ASSERT_TRUE(split[0].report.ok()) << split[0].report.status();
  ASSERT_TRUE(whole[0].report.ok()) << whole[0].report.status();
  for (const auto& [name, t] : whole[0].params) {
    const std::vector<float>& got = split[0].params.at(name).values;
    ASSERT_EQ(got.size(), t.values.size());
    EXPECT_LT(test::MaxRelDiff(t.values, got), 1e-4) << name;
  }
}

// Co-located aggregation: one worker driving 2 replicas of batch b each (its
// batch of 2b split in two) ends where 2 workers of batch b do under sync,
// and crosses to the servers once per BN layer and phase, not per replica.
TEST(TrainerTest, ReplicasCombineOnTheHostAndMatchSeparateWorkers) {
  const int64_t b = 4, steps = 2;
  const Dataset all = worker::MakeSyntheticDataset(2 * b * steps, 12, 12, 10, 7);
  const Dataset single = test::Interleaved(all, b, steps);
  TrainerOptions two;
  two.batch_size = b;
  two.shuffle = false;
  two.max_steps = steps;
  two.evaluate = false;
  TrainerOptions replicated = two;
  replicated.batch_size = 2 * b;
  for (policy::Policy p : {policy::Policy::kSync, policy::Policy::kLocal}) {
    SCOPED_TRACE(policy::PolicyName(p));
    auto split_job = test::InProcessJob::Create(JobOptions(p, 2), 2);
    auto host_job = test::InProcessJob::Create(JobOptions(p, 1), 2);
    ASSERT_TRUE(split_job.ok() && host_job.ok());
    // Under local, the reference is one worker with the whole batch: a
    // worker's local BN is over its batch, whatever it runs on.
    std::vector<WorkerRun> reference =
        p == policy::Policy::kSync
            ? Train(split_job->get(), {&all, &all}, two)
            : Train(host_job->get(), {&single}, replicated);
    auto replica_job = test::InProcessJob::Create(JobOptions(p, 1), 2);
    ASSERT_TRUE(replica_job.ok());
    std::vector<WorkerRun> host = Train(replica_job->get(), {&single},
                                        replicated, nullptr, {test::SmallModel()});
    ASSERT_TRUE(reference[0].report.ok()) << reference[0].report.status();
    ASSERT_TRUE(host[0].report.ok()) << host[0].report.status();
    for (const auto& [name, t] : reference[0].params) {
      const std::vector<float>& got = host[0].params.at(name).values;
      ASSERT_EQ(got.size(), t.values.size());
      EXPECT_LT(test::MaxRelDiff(t.values, got), 1e-5) << name;
    }
    for (size_t l = 0; l < reference[0].running.size(); ++l) {
      for (size_t c = 0; c < reference[0].running[l].mean.size(); ++c) {
        EXPECT_NEAR(host[0].running[l].mean[c], reference[0].running[l].mean[c],
                    1e-6);
      }
    }
    if (p == policy::Policy::kSync) {
      // One forward and one backward exchange per layer per step, one push
      // of all 2b samples.
      const std::vector<std::string> step1 =
          CallsOf(host[0].calls, "pull 1", "pull 2");
      const size_t layers = host[0].bn_layers.size();
      ASSERT_EQ(step1.size(), 2 + 2 * layers);
      EXPECT_EQ(step1[1], absl::StrCat("fwd ", host[0].bn_layers[0], " 1"));
      EXPECT_EQ(step1.back(), absl::StrCat("push 1 n=", 2 * b));
    }
  }
}

// A replica built from other options is refused before anything runs.
TEST(TrainerTest, AReplicaOfAnotherModelIsRefused) {
  const Dataset data = worker::MakeSyntheticDataset(48, 12, 12, 10, 4);
  auto job = test::InProcessJob::Create(JobOptions(policy::Policy::kSync, 1), 1);
  ASSERT_TRUE(job.ok());
  nn::ModelOptions deeper = test::SmallModel();
  deeper.depth = 2;  // its parameters include the first model's
  TrainerOptions o = ThreeSteps();
  o.evaluate = false;
  std::vector<WorkerRun> runs = Train(job->get(), {&data}, o, nullptr, {deeper});
  ASSERT_FALSE(runs[0].report.ok());
  EXPECT_EQ(runs[0].report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(runs[0].report.status().message(),
              HasSubstr("replica 1 is not the same model"));
  EXPECT_THAT(runs[0].calls, ::testing::Not(::testing::Contains("push 0 n=4")));
}

TEST(TrainerTest, AFailedCallEndsTheRunNamingTheStep) {
  const Dataset data = worker::MakeSyntheticDataset(48, 12, 12, 10, 4);
  auto job = test::InProcessJob::Create(JobOptions(policy::Policy::kLocal, 1), 1);
  ASSERT_TRUE(job.ok());
  std::vector<WorkerRun> runs =
      Train(job->get(), {&data}, ThreeSteps(), [](int, RecordingClient* c) {
        c->FailPushAt(1, absl::UnavailableError("shard 0 went away"));
      });
  ASSERT_FALSE(runs[0].report.ok());
  EXPECT_EQ(runs[0].report.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(runs[0].report.status().message(), HasSubstr("step 1"));
  EXPECT_THAT(runs[0].report.status().message(), HasSubstr("shard 0 went away"));
  EXPECT_EQ(runs[0].calls.back(), "push 1 n=4");  // nothing after the failure
}

// Pushing each layer's gradients during the backward pass, and BN backward
// exchanges overlapping weight gradients, change nothing:
// the same parameters and running statistics, bit for bit, under each
// policy a job of these workers runs deterministically.
TEST(TrainerTest, OverlappedPushGivesTheBitsOfThePushAfterTheBackwardPass) {
  const Dataset data = worker::MakeSyntheticDataset(48, 12, 12, 10, 6);
  struct Case {
    policy::Policy policy;
    int workers;
  };
  for (const Case& c : {Case{policy::Policy::kSync, 2},
                        Case{policy::Policy::kLocal, 2},
                        Case{policy::Policy::kAsync, 1}}) {
    SCOPED_TRACE(policy::PolicyName(c.policy));
    std::vector<const Dataset*> datasets(c.workers, &data);
    TrainerOptions after = ThreeSteps();
    after.overlap = false;
    TrainerOptions during = ThreeSteps();
    during.overlap = true;
    during.overlap_bn = true;
    auto job_after = test::InProcessJob::Create(JobOptions(c.policy, c.workers), 2);
    auto job_during = test::InProcessJob::Create(JobOptions(c.policy, c.workers), 2);
    ASSERT_TRUE(job_after.ok() && job_during.ok());
    std::vector<WorkerRun> base = Train(job_after->get(), datasets, after);
    std::vector<WorkerRun> overlapped =
        Train(job_during->get(), datasets, during,
              [](int, RecordingClient* client) { client->ForwardParts(); });
    for (int w = 0; w < c.workers; ++w) {
      ASSERT_TRUE(base[w].report.ok()) << base[w].report.status();
      ASSERT_TRUE(overlapped[w].report.ok()) << overlapped[w].report.status();
      test::ExpectSameEnd(overlapped[w], base[w]);
      EXPECT_EQ(overlapped[w].report->test_accuracy,
                base[w].report->test_accuracy);
      // The parts went out one layer at a time, the head's first, and under
      // sync while BN backward exchanges were still to come.
      std::vector<std::string> parts;
      int bwd_after_first_part = 0;
      for (const std::string& call : overlapped[w].calls) {
        if (absl::StartsWith(call, "part 1 ")) parts.push_back(call);
        if (!parts.empty() && absl::StartsWith(call, "bwd ") &&
            absl::EndsWith(call, " 1")) {
          ++bwd_after_first_part;
        }
      }
      ASSERT_GT(parts.size(), 3u);
      EXPECT_EQ(parts[0], "part 1 head.fc.b,head.fc.w");
      if (c.policy == policy::Policy::kSync) {
        EXPECT_GT(bwd_after_first_part, 0);
      }
    }
  }
}

// Pulling each step's parameters layer by layer changes nothing: the same
// parameters and running statistics, bit for bit, under sync and local with
// 2 workers, and with 2 replicas per worker. Each key is waited for just
// before its layer runs: the stem's before the step's first BN exchange, the
// head's after the last.
TEST(TrainerTest, LayerPullGivesTheBitsOfTheWholePull) {
  const Dataset data = worker::MakeSyntheticDataset(48, 12, 12, 10, 6);
  struct Case {
    policy::Policy policy;
    bool replicas;
  };
  for (const Case& c : {Case{policy::Policy::kSync, false},
                        Case{policy::Policy::kLocal, false},
                        Case{policy::Policy::kSync, true}}) {
    SCOPED_TRACE(absl::StrCat(policy::PolicyName(c.policy),
                              c.replicas ? " with replicas" : ""));
    const std::vector<const Dataset*> datasets(2, &data);
    TrainerOptions whole = ThreeSteps();
    whole.layer_pull = false;
    TrainerOptions layered = ThreeSteps();
    layered.layer_pull = true;
    const std::vector<nn::ModelOptions> replicas =
        c.replicas ? std::vector<nn::ModelOptions>{test::SmallModel()}
                   : std::vector<nn::ModelOptions>{};
    auto job_whole = test::InProcessJob::Create(JobOptions(c.policy, 2), 2);
    auto job_layered = test::InProcessJob::Create(JobOptions(c.policy, 2), 2);
    ASSERT_TRUE(job_whole.ok() && job_layered.ok());
    std::vector<WorkerRun> base =
        Train(job_whole->get(), datasets, whole, nullptr, replicas);
    std::vector<WorkerRun> runs = Train(
        job_layered->get(), datasets, layered,
        [&](int, RecordingClient* client) {
          if (!c.replicas) client->RecordWaits();
        },
        replicas);
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(base[w].report.ok()) << base[w].report.status();
      ASSERT_TRUE(runs[w].report.ok()) << runs[w].report.status();
      test::ExpectSameEnd(runs[w], base[w]);
      EXPECT_EQ(runs[w].report->test_accuracy, base[w].report->test_accuracy);
      if (c.policy != policy::Policy::kSync || c.replicas) continue;
      const std::vector<std::string>& calls = runs[w].calls;
      auto at = [&](const std::string& call) {
        return std::find(calls.begin(), calls.end(), call) - calls.begin();
      };
      const auto end = static_cast<std::ptrdiff_t>(calls.size());
      for (const char* call : {"wait head.fc.w", "wait stem.conv.w",
                               "wait stage1.block0.conv1.w", "fwd stem.bn 0",
                               "fwd stage2.block0.bn2 0"}) {
        ASSERT_LT(at(call), end) << call;
      }
      EXPECT_LT(at("wait stem.conv.w"), at("fwd stem.bn 0"));
      EXPECT_LT(at("fwd stem.bn 0"), at("wait stage1.block0.conv1.w"));
      EXPECT_GT(at("wait head.fc.w"), at("fwd stage2.block0.bn2 0"));
    }
  }
}

// A part that fails in the middle of the backward pass fails the step, with
// the step named, but only after every other part was pushed: the servers
// hold all of the step's keys but the failed part's.
TEST(TrainerTest, AFailedPartFailsTheStepAfterTheOtherPartsArePushed) {
  const Dataset data = worker::MakeSyntheticDataset(48, 12, 12, 10, 8);
  auto job = test::InProcessJob::Create(JobOptions(policy::Policy::kLocal, 1), 2);
  ASSERT_TRUE(job.ok());
  std::vector<WorkerRun> runs =
      Train(job->get(), {&data}, ThreeSteps(), [](int, RecordingClient* c) {
        c->ForwardParts();
        c->FailPartAt(1, 1, absl::UnavailableError("shard 1 went away"));
      });
  ASSERT_FALSE(runs[0].report.ok());
  const absl::Status& s = runs[0].report.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("step 1: pushing gradients"));
  EXPECT_THAT(s.message(), HasSubstr("shard 1 went away"));
  EXPECT_EQ(runs[0].calls.back(), "push_done 1");  // nothing after it

  // The failed part: the second of step 1.
  std::vector<std::string> parts;
  for (const std::string& call : runs[0].calls) {
    if (absl::StartsWith(call, "part 1 ")) parts.push_back(call.substr(7));
  }
  ASSERT_GT(parts.size(), 2u);
  const std::vector<std::string> failed = absl::StrSplit(parts[1], ',');
  int at_step_1 = 0, at_step_0 = 0;
  for (int shard = 0; shard < 2; ++shard) {
    for (const store::StoreState::Key& k :
         (*job)->shard(shard).store().Export().keys) {
      const bool in_failed = absl::c_linear_search(failed, k.key);
      EXPECT_EQ(k.last_pushed[0], in_failed ? 0 : 1) << k.key;
      ++(k.last_pushed[0] == 1 ? at_step_1 : at_step_0);
    }
  }
  EXPECT_GT(at_step_1, 0);
  EXPECT_GT(at_step_0, 0);
}

TEST(TrainerTest, AServerPolicyItDoesNotKnowIsRefused) {
  const Dataset data = worker::MakeSyntheticDataset(16, 12, 12, 10, 5);
  auto job = test::InProcessJob::Create(JobOptions(policy::Policy::kSync, 1), 1);
  ASSERT_TRUE(job.ok());
  std::vector<WorkerRun> runs =
      Train(job->get(), {&data}, ThreeSteps(), [](int, RecordingClient* c) {
        c->mutable_config()->set_policy(proto::POLICY_UNSPECIFIED);
      });
  EXPECT_EQ(runs[0].report.status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(runs[0].calls.empty());  // refused before any call
}

}  // namespace
}  // namespace bnps
