// The training loop through real servers on 127.0.0.1 (in-process, ephemeral
// ports): the sync invariant on a whole model, and every policy end to end.

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/server_runner.h"
#include "worker/data/dataset.h"
#include "worker/data/synthetic.h"
#include "nn/cpu_backend.h"
#include "nn/model.h"
#include "client/grpc_ps_client.h"
#include "worker/training_testing.h"
#include "worker/trainer.h"

namespace bnps {
namespace {

using worker::Dataset;
using worker::TrainerOptions;
using worker::TrainReport;
using test::Interleaved;
using test::MaxRelDiff;
using test::SmallModel;

struct WorkerResult {
  absl::StatusOr<TrainReport> report = absl::UnknownError("not run");
  nn::HostTensors params;
  std::vector<bn::RunningStats> running;
};

// S servers of one job; W trainers on threads, worker w on datasets[w].
// `gradients` unset: the policy's shorthand pair.
std::vector<WorkerResult> Train(
    policy::Policy policy, int shards,
    const std::vector<const Dataset*>& datasets, const TrainerOptions& options,
    int64_t staleness = 0,
    std::optional<policy::Gradients> gradients = std::nullopt,
    const nn::ModelOptions& model_options = SmallModel(),
    int64_t push_part_bytes = -1, int bn_port = -1) {
  const int workers = static_cast<int>(datasets.size());
  server::ShardOptions base;
  base.num_shards = shards;
  base.num_workers = workers;
  base.policy = policy;
  base.gradients = gradients;
  base.staleness = staleness;
  base.optimizer.learning_rate = 0.05;
  base.optimizer.momentum = 0.9;
  base.optimizer.weight_decay = 1e-4;
  base.barrier_timeout = absl::Seconds(30);
  std::vector<std::unique_ptr<server::RunningServer>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < shards; ++s) {
    base.shard = s;
    server::ServerLatency latency;
    latency.bn_port = bn_port;
    auto r = server::RunningServer::Start(base, "127.0.0.1:0", {}, {}, latency);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    addresses.push_back("127.0.0.1:" + std::to_string((*r)->port()));
    servers.push_back(*std::move(r));
  }
  std::vector<WorkerResult> results(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      client::GrpcClientOptions o;
      o.servers = addresses;
      o.job = "bnps";
      o.worker = w;
      o.num_workers = workers;
      o.rpc_timeout = absl::Seconds(30);
      if (push_part_bytes >= 0) o.push_part_bytes = push_part_bytes;
      auto client = client::GrpcPsClient::Connect(o);
      if (!client.ok()) {
        results[w].report = client.status();
        return;
      }
      std::unique_ptr<nn::Backend> backend = nn::NewCpuBackend();
      auto model = nn::Model::Create(model_options, backend.get());
      if (!model.ok()) {
        results[w].report = model.status();
        return;
      }
      worker::Trainer trainer(client->get(), model->get(), datasets[w],
                              datasets[w], options);
      results[w].report = trainer.Run();
      for (const nn::Parameter* p : (*model)->parameters()) {
        results[w].params[p->name] = nn::HostTensor{p->dims, p->host};
      }
      for (const nn::BatchNorm* bn : (*model)->batch_norms()) {
        results[w].running.push_back(bn->running());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (bn_port >= 0) {
    // The BN traffic really went over TCP (else the stream carried it).
    int64_t connections = 0;
    for (const auto& s : servers) {
      connections += s->bn_socket_server()->accepted();
    }
    EXPECT_GT(connections, 0);
  }
  return results;
}

// The central invariant on the whole model: with sync, 2 workers of batch b
// follow 1 worker of batch 2b step by step. Worker w's shard is read in
// order, so the single worker's data is arranged to hold, at step k, worker
// 0's batch k followed by worker 1's.
TEST(TrainingTest, SyncTwoWorkersFollowOneWorkerWithTheConcatenatedBatch) {
  const int64_t b = 6, steps = 4;
  const Dataset all = worker::MakeSyntheticDataset(2 * b * steps, 12, 12, 10, 7);
  const Dataset single = Interleaved(all, b, steps);
  for (int64_t k : {1, 2, 4}) {
    SCOPED_TRACE(testing::Message() << "after " << k << " steps");
    TrainerOptions two;
    two.batch_size = b;
    two.shuffle = false;
    two.max_steps = k;
    two.evaluate = false;
    TrainerOptions one = two;
    one.batch_size = 2 * b;
    std::vector<WorkerResult> split =
        Train(policy::Policy::kSync, 2, {&all, &all}, two);
    std::vector<WorkerResult> whole =
        Train(policy::Policy::kSync, 2, {&single}, one);
    ASSERT_EQ(split.size(), 2u);
    ASSERT_EQ(whole.size(), 1u);
    ASSERT_TRUE(split[0].report.ok()) << split[0].report.status();
    ASSERT_TRUE(split[1].report.ok()) << split[1].report.status();
    ASSERT_TRUE(whole[0].report.ok()) << whole[0].report.status();
    double worst = 0;
    for (const auto& [name, t] : whole[0].params) {
      const double d = MaxRelDiff(t.values, split[0].params.at(name).values);
      EXPECT_LT(d, 1e-4) << name;
      EXPECT_EQ(split[0].params.at(name).values, split[1].params.at(name).values)
          << name;
      worst = std::max(worst, d);
    }
    // The servers' running statistics too.
    for (size_t l = 0; l < whole[0].running.size(); ++l) {
      for (size_t c = 0; c < whole[0].running[l].mean.size(); ++c) {
        EXPECT_NEAR(whole[0].running[l].mean[c], split[0].running[l].mean[c],
                    1e-4);
        EXPECT_NEAR(whole[0].running[l].var[c], split[0].running[l].var[c],
                    1e-4 * whole[0].running[l].var[c]);
      }
    }
    std::printf("after %lld steps: largest relative parameter difference %.3g\n",
                static_cast<long long>(k), worst);
  }
}

// The same at one example per worker on the variants where it matters: BN
// after fully connected layers (statistics over the batch alone) and BN on
// 1x1 maps deep in the network. Each worker's local BN would be degenerate
// (one sample); sync normalizes over the two workers' samples exactly as one
// worker of batch 2 does.
TEST(TrainingTest, SyncAtOneExamplePerWorkerFollowsOneWorker) {
  const int64_t steps = 3;
  const Dataset all = worker::MakeSyntheticDataset(2 * steps, 12, 12, 10, 5);
  const Dataset single = Interleaved(all, 1, steps);
  for (nn::Architecture a : {nn::Architecture::kFcBn, nn::Architecture::kDeep}) {
    SCOPED_TRACE(nn::ArchitectureName(a));
    nn::ModelOptions m = SmallModel();
    m.architecture = a;
    TrainerOptions two;
    two.batch_size = 1;
    two.shuffle = false;
    two.max_steps = steps;
    two.evaluate = false;
    TrainerOptions one = two;
    one.batch_size = 2;
    auto split = Train(policy::Policy::kSync, 2, {&all, &all}, two, 0,
                       std::nullopt, m);
    auto whole =
        Train(policy::Policy::kSync, 2, {&single}, one, 0, std::nullopt, m);
    ASSERT_EQ(split.size(), 2u);
    ASSERT_TRUE(split[0].report.ok()) << split[0].report.status();
    ASSERT_TRUE(whole[0].report.ok()) << whole[0].report.status();
    for (const auto& [name, t] : whole[0].params) {
      EXPECT_LT(MaxRelDiff(t.values, split[0].params.at(name).values), 1e-4)
          << name;
    }
    // Local BN at one example per worker does not: it trains on nothing
    // below the first BN layer.
    auto local = Train(policy::Policy::kLocal, 2, {&all, &all}, two, 0,
                       std::nullopt, m);
    ASSERT_TRUE(local[0].report.ok()) << local[0].report.status();
    const std::string first = a == nn::Architecture::kFcBn ? "fc0.w" : "stem.conv.w";
    EXPECT_GT(MaxRelDiff(whole[0].params.at(first).values,
                         local[0].params.at(first).values),
              1e-3);
  }
}

// Pushing each layer's gradients during the backward pass, and BN backward
// exchanges overlapping weight gradients, over real servers
// and sockets, ends every worker on the very bits of the push after the pass
// (2 workers, 2 shards, sync; 1 worker under async), every layer's
// gradients in a push of their own.
TEST(TrainingTest, OverlappedPushGivesTheBitsOfThePushAfterTheBackwardPass) {
  const Dataset data = worker::MakeSyntheticDataset(48, 12, 12, 10, 9);
  struct Case {
    policy::Policy policy;
    int workers;
  };
  for (const Case& c :
       {Case{policy::Policy::kSync, 2}, Case{policy::Policy::kAsync, 1}}) {
    SCOPED_TRACE(policy::PolicyName(c.policy));
    TrainerOptions after;
    after.batch_size = 6;
    after.shuffle = false;
    after.max_steps = 3;
    after.evaluate = false;
    after.overlap = false;
    TrainerOptions during = after;
    during.overlap = true;
    during.overlap_bn = true;
    const std::vector<const Dataset*> datasets(c.workers, &data);
    std::vector<WorkerResult> base = Train(c.policy, 2, datasets, after);
    // Every layer's gradients in a push of their own (the model is small).
    std::vector<WorkerResult> overlapped =
        Train(c.policy, 2, datasets, during, 0, std::nullopt, SmallModel(),
              /*push_part_bytes=*/0);
    ASSERT_EQ(base.size(), static_cast<size_t>(c.workers));
    ASSERT_EQ(overlapped.size(), static_cast<size_t>(c.workers));
    for (int w = 0; w < c.workers; ++w) {
      ASSERT_TRUE(base[w].report.ok()) << base[w].report.status();
      ASSERT_TRUE(overlapped[w].report.ok()) << overlapped[w].report.status();
      test::ExpectSameEnd(overlapped[w], base[w]);
    }
  }
}

// Local BN would not match: the test above can fail.
TEST(TrainingTest, LocalTwoWorkersDoNotFollowOneWorker) {
  const int64_t b = 6, steps = 2;
  const Dataset all = worker::MakeSyntheticDataset(2 * b * steps, 12, 12, 10, 7);
  TrainerOptions two;
  two.batch_size = b;
  two.shuffle = false;
  two.max_steps = steps;
  two.evaluate = false;
  TrainerOptions one = two;
  one.batch_size = 2 * b;
  const Dataset single = Interleaved(all, b, steps);
  auto split = Train(policy::Policy::kLocal, 2, {&all, &all}, two);
  auto whole = Train(policy::Policy::kLocal, 2, {&single}, one);
  ASSERT_TRUE(split[0].report.ok()) << split[0].report.status();
  ASSERT_TRUE(whole[0].report.ok()) << whole[0].report.status();
  EXPECT_GT(MaxRelDiff(whole[0].params.at("stem.conv.w").values,
                       split[0].params.at("stem.conv.w").values),
            1e-3);
}

// Pulling each step's parameters layer by layer (in_order streams from 2
// shards) ends every worker on the very bits of the whole pull before the
// pass, under sync and local with 2 workers.
TEST(TrainingTest, LayerPullGivesTheBitsOfTheWholePull) {
  const Dataset data = worker::MakeSyntheticDataset(48, 12, 12, 10, 9);
  for (policy::Policy p : {policy::Policy::kSync, policy::Policy::kLocal}) {
    SCOPED_TRACE(policy::PolicyName(p));
    TrainerOptions whole;
    whole.batch_size = 6;
    whole.shuffle = false;
    whole.max_steps = 3;
    whole.evaluate = false;
    whole.layer_pull = false;
    TrainerOptions layered = whole;
    layered.layer_pull = true;
    const std::vector<const Dataset*> datasets(2, &data);
    std::vector<WorkerResult> base = Train(p, 2, datasets, whole);
    std::vector<WorkerResult> runs = Train(p, 2, datasets, layered);
    ASSERT_EQ(base.size(), 2u);
    ASSERT_EQ(runs.size(), 2u);
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(base[w].report.ok()) << base[w].report.status();
      ASSERT_TRUE(runs[w].report.ok()) << runs[w].report.status();
      test::ExpectSameEnd(runs[w], base[w]);
    }
  }
}

// Every policy trains end to end: the loss falls, the run settles its
// running statistics, and the evaluation beats chance.
TEST(TrainingTest, EveryPolicyTrains) {
  const Dataset data = worker::MakeSyntheticDataset(1536, 12, 12, 10, 3);
  struct Case {
    policy::Policy policy;
    int64_t staleness;
    worker::RecalMode mode;
    bool recalibrate;
  };
  for (const Case& c : {Case{policy::Policy::kSync, 0, worker::RecalMode::kPrecise, false},
                        Case{policy::Policy::kAsync, 1, worker::RecalMode::kPrecise, false},
                        Case{policy::Policy::kLocal, 0, worker::RecalMode::kExact, true},
                        Case{policy::Policy::kRecal, 0, worker::RecalMode::kPrecise, false},
                        Case{policy::Policy::kRecal, 0, worker::RecalMode::kExact, false}}) {
    SCOPED_TRACE(testing::Message()
                 << policy::PolicyName(c.policy) << " recal "
                 << worker::RecalModeName(c.mode));
    TrainerOptions o;
    o.batch_size = 16;
    o.epochs = 2;
    o.recal_mode = c.mode;
    o.recalibrate = c.recalibrate;
    o.test_examples = 512;
    o.eval_every_epoch = true;  // sync, async: the servers' stats mid-run
    auto results = Train(c.policy, 2, {&data, &data}, o, c.staleness);
    ASSERT_EQ(results.size(), 2u);
    for (const WorkerResult& r : results) {
      ASSERT_TRUE(r.report.ok()) << r.report.status();
      EXPECT_EQ(r.report->steps, 2 * 1536 / 2 / 16);
      EXPECT_LT(r.report->train_loss_last, 0.7 * r.report->train_loss_first);
      ASSERT_TRUE(r.report->test_accuracy.has_value());
      EXPECT_GT(*r.report->test_accuracy, 0.3);
      ASSERT_GE(r.report->evals.size(), 2u);  // after epoch 1, and at the end
      EXPECT_GT(r.report->evals.front().test_accuracy, 0.2);
      if (c.recalibrate || c.policy == policy::Policy::kRecal) {
        ASSERT_TRUE(r.report->test_accuracy_recal.has_value());
      }
    }
    // Settled statistics agree across workers (sync, async: the servers'
    // final ones; local: averaged; recal: population).
    ASSERT_FALSE(results[0].running.empty());
    for (size_t l = 0; l < results[0].running.size(); ++l) {
      EXPECT_EQ(results[0].running[l].mean, results[1].running[l].mean)
          << "layer " << l;
      EXPECT_EQ(results[0].running[l].var, results[1].running[l].var)
          << "layer " << l;
    }
    if (c.policy == policy::Policy::kAsync) {
      EXPECT_LE(results[0].report->max_staleness, 1);
    }
  }
}

// The BN policy and the gradient mode crossed: each pair trains end to end
// on real servers, async gradients stay within the bound and sync ones are
// never stale.
TEST(TrainingTest, CrossedPairsTrain) {
  const Dataset data = worker::MakeSyntheticDataset(1536, 12, 12, 10, 3);
  struct Case {
    policy::Policy bn;
    policy::Gradients gradients;
  };
  for (const Case& c : {Case{policy::Policy::kAsync, policy::Gradients::kSync},
                        Case{policy::Policy::kSync, policy::Gradients::kAsync},
                        Case{policy::Policy::kRecal, policy::Gradients::kAsync}}) {
    SCOPED_TRACE(policy::JobPolicyName({c.bn, c.gradients}));
    TrainerOptions o;
    o.batch_size = 16;
    o.epochs = 2;
    o.test_examples = 512;
    auto results = Train(c.bn, 2, {&data, &data}, o, 2, c.gradients);
    ASSERT_EQ(results.size(), 2u);
    for (const WorkerResult& r : results) {
      ASSERT_TRUE(r.report.ok()) << r.report.status();
      EXPECT_EQ(r.report->policy, policy::JobPolicyName({c.bn, c.gradients}));
      EXPECT_EQ(r.report->steps, 2 * 1536 / 2 / 16);
      EXPECT_LT(r.report->train_loss_last, 0.7 * r.report->train_loss_first);
      ASSERT_TRUE(r.report->test_accuracy.has_value());
      EXPECT_GT(*r.report->test_accuracy, 0.3);
      std::printf("%s: test accuracy %.4f\n",
                  policy::JobPolicyName({c.bn, c.gradients}).c_str(),
                  *r.report->test_accuracy);
      if (c.gradients == policy::Gradients::kSync) {
        EXPECT_EQ(r.report->max_staleness, 0);
      } else {
        EXPECT_LE(r.report->max_staleness, 2);
      }
    }
    for (size_t l = 0; l < results[0].running.size(); ++l) {
      EXPECT_EQ(results[0].running[l].mean, results[1].running[l].mean);
    }
  }
}

// BN over raw TCP (bnps_server --bn_port) carries the same messages as the
// gRPC stream: training ends on the same bits, sync and async.
TEST(TrainingTest, BnOverTcpGivesTheBitsOfTheStream) {
  const Dataset data = worker::MakeSyntheticDataset(48, 12, 12, 10, 13);
  for (policy::Policy policy : {policy::Policy::kSync, policy::Policy::kAsync}) {
    SCOPED_TRACE(policy::PolicyName(policy));
    TrainerOptions options;
    options.batch_size = 6;
    options.shuffle = false;
    options.max_steps = 3;
    options.evaluate = false;
    const int workers = policy == policy::Policy::kSync ? 2 : 1;
    const std::vector<const Dataset*> datasets(workers, &data);
    std::vector<WorkerResult> stream = Train(policy, 2, datasets, options);
    std::vector<WorkerResult> tcp =
        Train(policy, 2, datasets, options, 0, std::nullopt, SmallModel(), -1,
              /*bn_port=*/0);
    ASSERT_EQ(stream.size(), static_cast<size_t>(workers));
    ASSERT_EQ(tcp.size(), static_cast<size_t>(workers));
    for (int w = 0; w < workers; ++w) {
      ASSERT_TRUE(stream[w].report.ok()) << stream[w].report.status();
      ASSERT_TRUE(tcp[w].report.ok()) << tcp[w].report.status();
      test::ExpectSameEnd(tcp[w], stream[w]);
    }
  }
}

}  // namespace
}  // namespace bnps
