// Elastic workers end to end, through real servers on 127.0.0.1 (in-process,
// ephemeral ports): a sync job that grows from 2 to 4 workers at one step and
// shrinks back to 2 at a later one, without a restart, ends on the same bits
// as the job that stops at each of those steps (checkpoint, servers and
// workers gone) and restarts from its checkpoint with the new count. The
// cases marked "PerWorkerTokens" run the same jobs with the servers under
// per-worker tokens, each worker holding only its own
// (security/worker_token.h): joins and leaves need no job token.

#include <stdlib.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/grpc_ps_client.h"
#include "gtest/gtest.h"
#include "proto/membership_history.h"
#include "security/worker_token.h"
#include "server/server_runner.h"
#include "worker/training_testing.h"
#include "worker/data/dataset.h"
#include "worker/data/synthetic.h"
#include "nn/cpu_backend.h"
#include "nn/model.h"
#include "worker/trainer.h"

namespace bnps {
namespace {

constexpr int kIds = 4;      // the job's worker ids
constexpr int kShards = 2;
constexpr int64_t kSteps = 12;
// The job token of the per-worker-token runs (the servers' only).
constexpr char kJobToken[] =
    "elastic-test-job-token-0123456789abcdef0123456789abcdef";

struct WorkerResult {
  absl::StatusOr<worker::TrainReport> report = absl::UnknownError("not run");
  nn::HostTensors params;
  std::vector<bn::RunningStats> running;
};

struct RunResult {
  std::vector<WorkerResult> workers;
  std::vector<server::Shard::Digest> digests;  // by shard
  std::string membership;                      // shard 0's at the end
};

// Servers with `membership` (and checkpoints under `checkpoint_dir` every
// `checkpoint_every` steps, if not empty); trainers for `ids` with
// `options`, each stopping after `max_steps`; the trainers of `late_ids`
// start once shard 0 reached version `late_after` (and ask to join); worker
// `leaver` leaves early at step `leave_at`. With `per_worker_tokens`, the
// servers hold the job token and run --per_worker_tokens, and each worker
// holds only its own token. A restarted job's workers roll it back to its
// newest checkpoint first (Trainer::Run).
RunResult RunJob(const std::string& membership, const std::vector<int>& ids,
                 worker::TrainerOptions options, int64_t max_steps,
                 const worker::Dataset& data, bool per_worker_tokens,
                 const std::string& checkpoint_dir = "",
                 int64_t checkpoint_every = 0,
                 const std::vector<int>& late_ids = {},
                 int64_t late_after = 0, int leaver = -1,
                 int64_t leave_at = 0) {
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
  server::ServerSecurity auth;
  if (per_worker_tokens) {
    auth.token = kJobToken;
    auth.per_worker_tokens = true;
  }
  std::vector<std::unique_ptr<server::RunningServer>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < kShards; ++s) {
    base.shard = s;
    if (!checkpoint_dir.empty()) {
      base.checkpoint_dir = checkpoint_dir + "/shard" + std::to_string(s);
    }
    auto r = server::RunningServer::Start(base, "127.0.0.1:0", auth);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return out;
    addresses.push_back("127.0.0.1:" + std::to_string((*r)->port()));
    servers.push_back(*std::move(r));
  }
  options.max_steps = max_steps;
  std::vector<int> all = ids;
  all.insert(all.end(), late_ids.begin(), late_ids.end());
  out.workers.resize(all.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i == ids.size()) {
      while (servers[0]->shard().store().GetStats().min_version < late_after) {
        absl::SleepFor(absl::Milliseconds(2));
      }
    }
    threads.emplace_back([&, i] {
      WorkerResult& result = out.workers[i];
      client::GrpcClientOptions o;
      o.servers = addresses;
      o.job = "bnps";
      o.worker = all[i];
      o.num_workers = kIds;
      o.rpc_timeout = absl::Seconds(30);
      if (per_worker_tokens) o.token = security::WorkerToken(kJobToken, all[i]);
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
      worker::TrainerOptions mine = options;
      if (all[i] == leaver) mine.leave_at_step = leave_at;
      worker::Trainer trainer(client->get(), model->get(), &data, &data,
                              mine);
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
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_TRUE(out.workers[i].report.ok())
        << "worker " << all[i] << ": " << out.workers[i].report.status();
  }
  for (auto& s : servers) out.digests.push_back(s->shard().ComputeDigest());
  out.membership = servers[0]->shard().history().ToString();
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

// 2 base workers of batch 4 over 72 examples: 9 steps an epoch, so a run
// crosses an epoch (and the last short batches) while resized.
worker::Dataset Data() { return worker::MakeSyntheticDataset(72, 12, 12, 10, 7); }

// The job stopped at each step where `membership` changes the count and
// restarted from its checkpoint of that step with the new count, against
// `elastic`, the job resized while it ran: the same bits.
void ExpectRestartsEqual(const std::string& membership,
                         const RunResult& elastic,
                         const worker::TrainerOptions& options,
                         int64_t checkpoint_every, int64_t steps,
                         bool per_worker_tokens) {
  SCOPED_TRACE(membership);
  const proto::MembershipHistory history =
      *proto::MembershipHistory::Parse(membership);
  const std::vector<proto::MembershipHistory::Segment>& seg = history.segments();
  // The job's last workers end on the final parameters (the last pull of
  // the run); the others ended at their last step.
  for (int w = 1; w < seg.back().num_workers; ++w) {
    SCOPED_TRACE(testing::Message() << "worker " << w);
    test::ExpectSameEnd(elastic.workers[w], elastic.workers[0]);
  }
  const worker::Dataset data = Data();
  char tmpl[] = "/tmp/elastic_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::string so_far;
  RunResult last;
  for (size_t i = 0; i < seg.size(); ++i) {
    so_far += (i > 0 ? "," : "") + std::to_string(seg[i].from_step) + ":" +
              std::to_string(seg[i].num_workers);
    const int64_t stop = i + 1 < seg.size() ? seg[i + 1].from_step : steps;
    last = RunJob(so_far, Ids(seg[i].num_workers), options, stop, data,
                  per_worker_tokens, dir, checkpoint_every);
  }
  std::system(("rm -rf " + dir).c_str());
  ASSERT_FALSE(last.workers.empty());
  test::ExpectSameEnd(last.workers[0], elastic.workers[0]);
  ASSERT_EQ(last.digests.size(), elastic.digests.size());
  for (size_t s = 0; s < elastic.digests.size(); ++s) {
    EXPECT_EQ(last.digests[s].step, steps);
    EXPECT_EQ(elastic.digests[s].step, steps);
    EXPECT_EQ(last.digests[s].entries, elastic.digests[s].entries)
        << "shard " << s;
  }
}

// A membership given at the start against its stop-and-restart run.
void ExpectResizeEqualsRestarts(const std::string& membership,
                                const worker::TrainerOptions& options,
                                int64_t checkpoint_every,
                                bool per_worker_tokens) {
  const RunResult elastic = RunJob(membership, Ids(kIds), options, kSteps,
                                   Data(), per_worker_tokens);
  ASSERT_EQ(elastic.workers.size(), static_cast<size_t>(kIds));
  EXPECT_EQ(elastic.membership, membership);
  ExpectRestartsEqual(membership, elastic, options, checkpoint_every, kSteps,
                      per_worker_tokens);
}

// The cases run with the job token and with per-worker tokens (the flag).
class ElasticTokensTest : public testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(
    Tokens, ElasticTokensTest, testing::Bool(),
    [](const testing::TestParamInfo<bool>& info) {
      return info.param ? "PerWorkerTokens" : "JobToken";
    });

TEST_P(ElasticTokensTest, ResizeEqualsStopAndRestartBitForBit) {
  ExpectResizeEqualsRestarts("0:2,4:4,8:2", Options(), 4, GetParam());
}

// Uneven slices (8 examples over 3 workers), a count below the base, and
// the parameters pulled layer by layer.
TEST(ElasticTest, UnevenCountsAndLayerPull) {
  worker::TrainerOptions o = Options();
  o.layer_pull = true;
  ExpectResizeEqualsRestarts("0:2,3:3,6:1,9:4", o, 3,
                             /*per_worker_tokens=*/false);
}

// Workers 2 and 3 start while a job of 2 runs and ask to join: the job
// rolls back to a checkpoint every server has and goes on with them from
// there. The servers chose that step; the job stopped there and restarted
// with the new count ends on the same bits.
TEST_P(ElasticTokensTest, AWorkerJoinsARunningJob) {
  constexpr int64_t kLong = 24, kEvery = 4;
  char tmpl[] = "/tmp/elastic_join_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const RunResult elastic =
      RunJob("0:2", Ids(2), Options(), kLong, Data(), GetParam(), dir, kEvery,
             /*late_ids=*/{2, 3}, /*late_after=*/6);
  std::system(("rm -rf " + dir).c_str());
  ASSERT_EQ(elastic.workers.size(), 4u);
  const proto::MembershipHistory history =
      *proto::MembershipHistory::Parse(elastic.membership);
  EXPECT_EQ(history.WorkersAt(kLong - 1), 4) << elastic.membership;
  for (const proto::MembershipHistory::Segment& s : history.segments()) {
    EXPECT_EQ(s.from_step % kEvery, 0) << elastic.membership;  // checkpoints
  }
  std::printf("the job took workers 2 and 3: membership %s\n",
              elastic.membership.c_str());
  ExpectRestartsEqual(elastic.membership, elastic, Options(), kEvery, kLong,
                      GetParam());
}

// Worker 3 of a running job of 4 leaves at step 10: the job goes on with 3
// from a checkpoint step, and ends on the bits of the job stopped there and
// restarted with 3.
TEST_P(ElasticTokensTest, AWorkerLeavesARunningJob) {
  constexpr int64_t kLong = 24, kEvery = 4;
  char tmpl[] = "/tmp/elastic_leave_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  worker::TrainerOptions options = Options();
  options.epochs = 6;  // 4 base workers: 5 steps an epoch
  const RunResult elastic =
      RunJob("0:4", Ids(4), options, kLong, Data(), GetParam(), dir, kEvery,
             {}, 0, /*leaver=*/3, /*leave_at=*/10);
  std::system(("rm -rf " + dir).c_str());
  ASSERT_EQ(elastic.workers.size(), 4u);
  const proto::MembershipHistory history =
      *proto::MembershipHistory::Parse(elastic.membership);
  ASSERT_EQ(history.segments().size(), 2u) << elastic.membership;
  EXPECT_EQ(history.segments()[1].num_workers, 3);
  EXPECT_LE(history.segments()[1].from_step, 10);
  EXPECT_EQ(history.segments()[1].from_step % kEvery, 0);
  std::printf("worker 3 left: membership %s\n", elastic.membership.c_str());
  ExpectRestartsEqual(elastic.membership, elastic, options, kEvery, kLong,
                      GetParam());
}

// The same job without the resize ends elsewhere: the test can fail.
TEST(ElasticTest, TheResizeChangesTheRun) {
  const RunResult elastic =
      RunJob("0:2,4:4,8:2", Ids(4), Options(), kSteps, Data(), false);
  const RunResult fixed =
      RunJob("0:2", Ids(2), Options(), kSteps, Data(), false);
  ASSERT_EQ(elastic.digests.size(), fixed.digests.size());
  bool differ = false;
  for (size_t s = 0; s < fixed.digests.size(); ++s) {
    differ = differ || fixed.digests[s].entries != elastic.digests[s].entries;
  }
  EXPECT_TRUE(differ);
}

}  // namespace
}  // namespace bnps
