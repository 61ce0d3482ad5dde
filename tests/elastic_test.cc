// Elastic workers end to end, through real servers on 127.0.0.1 (in-process,
// ephemeral ports): a sync job that grows from 2 to 4 workers at one step and
// shrinks back to 2 at a later one, without a restart, ends on the same bits
// as the job that stops at each of those steps (checkpoint, servers and
// workers gone) and restarts from its checkpoint with the new count.

#include <stdlib.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/grpc_ps_client.h"
#include "gtest/gtest.h"
#include "proto/membership_history.h"
#include "server/server_runner.h"
#include "tests/training_testing.h"
#include "worker/data/dataset.h"
#include "worker/data/synthetic.h"
#include "worker/nn/cpu_backend.h"
#include "worker/nn/model.h"
#include "worker/trainer.h"

namespace bnps {
namespace {

constexpr int kIds = 4;      // the job's worker ids
constexpr int kShards = 2;
constexpr int64_t kSteps = 12;

struct WorkerResult {
  absl::StatusOr<worker::TrainReport> report = absl::UnknownError("not run");
  nn::HostTensors params;
  std::vector<bn::RunningStats> running;
};

struct RunResult {
  std::vector<WorkerResult> workers;
  std::vector<server::Shard::Digest> digests;  // by shard
};

// Servers with `membership` (and checkpoints under `checkpoint_dir` every
// `checkpoint_every` steps, if not empty); trainers for `ids` with
// `options`, each stopping after `max_steps`. A restarted job's workers roll
// it back to its newest checkpoint first (Trainer::Run).
RunResult RunJob(const std::string& membership, const std::vector<int>& ids,
                 worker::TrainerOptions options, int64_t max_steps,
                 const worker::Dataset& data,
                 const std::string& checkpoint_dir = "",
                 int64_t checkpoint_every = 0) {
  RunResult out;
  server::ShardOptions base;
  base.num_shards = kShards;
  base.num_workers = kIds;
  base.membership = *proto::MembershipHistory::Parse(membership);
  base.policy = policy::Policy::kSync;
  base.optimizer.learning_rate = 0.05;
  base.optimizer.momentum = 0.9;
  base.optimizer.weight_decay = 1e-4;
  base.barrier_timeout = absl::Seconds(30);
  // A restarted job's new worker processes take the old ones' places.
  base.worker_loss = policy::WorkerLoss::kWait;
  base.checkpoint_dir = checkpoint_dir;
  base.checkpoint_every = checkpoint_every;
  std::vector<std::unique_ptr<server::RunningServer>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < kShards; ++s) {
    base.shard = s;
    if (!checkpoint_dir.empty()) {
      base.checkpoint_dir = checkpoint_dir + "/shard" + std::to_string(s);
    }
    auto r = server::RunningServer::Start(base, "127.0.0.1:0");
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return out;
    addresses.push_back("127.0.0.1:" + std::to_string((*r)->port()));
    servers.push_back(*std::move(r));
  }
  options.max_steps = max_steps;
  out.workers.resize(ids.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ids.size(); ++i) {
    threads.emplace_back([&, i] {
      WorkerResult& result = out.workers[i];
      client::GrpcClientOptions o;
      o.servers = addresses;
      o.job = "bnps";
      o.worker = ids[i];
      o.num_workers = kIds;
      o.rpc_timeout = absl::Seconds(30);
      auto client = client::GrpcPsClient::Connect(o);
      if (!client.ok()) {
        result.report = client.status();
        return;
      }
      std::unique_ptr<nn::Backend> backend = nn::NewCpuBackend();
      auto model = nn::Model::Create(test::SmallModel(), backend.get());
      if (!model.ok()) {
        result.report = model.status();
        return;
      }
      worker::Trainer trainer(client->get(), model->get(), &data, &data,
                              options);
      result.report = trainer.Run();
      for (const nn::Parameter* p : (*model)->parameters()) {
        result.params[p->name] = nn::HostTensor{p->dims, p->host};
      }
      for (const nn::BatchNorm* bn : (*model)->batch_norms()) {
        result.running.push_back(bn->running());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(out.workers[i].report.ok())
        << "worker " << ids[i] << ": " << out.workers[i].report.status();
  }
  for (auto& s : servers) out.digests.push_back(s->shard().ComputeDigest());
  return out;
}

std::vector<int> Ids(int n) {
  std::vector<int> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

worker::TrainerOptions Options() {
  worker::TrainerOptions o;
  o.batch_size = 4;
  o.epochs = 3;
  o.evaluate = false;
  return o;
}

// A resize at each of `steps` (to `counts`) against stopping there and
// restarting from the checkpoint of that step with the new count.
void ExpectResizeEqualsRestarts(int base, const std::vector<int64_t>& steps,
                                const std::vector<int>& counts,
                                const worker::TrainerOptions& options,
                                int64_t checkpoint_every) {
  // 2 base workers of batch 4 over 72 examples: 9 steps an epoch, so the
  // run crosses an epoch (and the last short batches) while resized.
  const worker::Dataset data = worker::MakeSyntheticDataset(72, 12, 12, 10, 7);
  std::string membership = "0:" + std::to_string(base);
  for (size_t i = 0; i < steps.size(); ++i) {
    membership += "," + std::to_string(steps[i]) + ":" + std::to_string(counts[i]);
  }
  SCOPED_TRACE(membership);
  const RunResult elastic = RunJob(membership, Ids(kIds), options, kSteps, data);
  ASSERT_EQ(elastic.workers.size(), static_cast<size_t>(kIds));
  // The job's last workers end on the final parameters (the last pull of
  // the run); the others ended at their last step.
  for (int w = 1; w < counts.back(); ++w) {
    test::ExpectSameEnd(elastic.workers[w], elastic.workers[0]);
  }

  char tmpl[] = "/tmp/elastic_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::string history = "0:" + std::to_string(base);
  int workers = base;
  for (size_t i = 0; i <= steps.size(); ++i) {
    const int64_t stop = i < steps.size() ? steps[i] : kSteps;
    const RunResult part = RunJob(history, Ids(workers), options, stop, data,
                                  dir, checkpoint_every);
    if (i == steps.size()) {
      std::system(("rm -rf " + dir).c_str());
      ASSERT_EQ(part.workers.size(), static_cast<size_t>(workers));
      test::ExpectSameEnd(part.workers[0], elastic.workers[0]);
      ASSERT_EQ(part.digests.size(), elastic.digests.size());
      for (size_t s = 0; s < elastic.digests.size(); ++s) {
        EXPECT_EQ(part.digests[s].step, kSteps);
        EXPECT_EQ(elastic.digests[s].step, kSteps);
        EXPECT_EQ(part.digests[s].entries, elastic.digests[s].entries)
            << "shard " << s;
      }
      break;
    }
    workers = counts[i];
    history += "," + std::to_string(steps[i]) + ":" + std::to_string(workers);
  }
}

TEST(ElasticTest, ResizeEqualsStopAndRestartBitForBit) {
  ExpectResizeEqualsRestarts(2, {4, 8}, {4, 2}, Options(), 4);
}

// Uneven slices (8 examples over 3 workers), a count below the base, and
// the parameters pulled layer by layer.
TEST(ElasticTest, UnevenCountsAndLayerPull) {
  worker::TrainerOptions o = Options();
  o.layer_pull = true;
  ExpectResizeEqualsRestarts(2, {3, 6, 9}, {3, 1, 4}, o, 3);
}

// The same job without the resize ends elsewhere: the test can fail.
TEST(ElasticTest, TheResizeChangesTheRun) {
  const worker::Dataset data = worker::MakeSyntheticDataset(72, 12, 12, 10, 7);
  const RunResult elastic =
      RunJob("0:2,4:4,8:2", Ids(4), Options(), kSteps, data);
  const RunResult fixed = RunJob("0:2", Ids(2), Options(), kSteps, data);
  ASSERT_EQ(elastic.digests.size(), fixed.digests.size());
  bool differ = false;
  for (size_t s = 0; s < fixed.digests.size(); ++s) {
    differ = differ || fixed.digests[s].entries != elastic.digests[s].entries;
  }
  EXPECT_TRUE(differ);
}

}  // namespace
}  // namespace bnps
