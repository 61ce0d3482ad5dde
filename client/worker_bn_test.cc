#include "client/worker_bn.h"

#include <memory>
#include <optional>
#include <vector>

#include "bn/moments.h"
#include "client/in_process_client.h"
#include "gtest/gtest.h"
#include "policy/policy.h"

namespace bnps::client {
namespace {

using policy::Policy;

bn::Moments M(int64_t count, std::vector<double> mean, std::vector<double> m2) {
  bn::Moments m;
  m.count = count;
  m.mean = std::move(mean);
  m.m2 = std::move(m2);
  return m;
}

TEST(WorkerBnTest, PlansTrafficOnlyForSyncAndAsync) {
  for (Policy p : {Policy::kSync, Policy::kAsync, Policy::kLocal,
                   Policy::kRecal}) {
    WorkerBn rule(p, 0.1);
    const bool traffic = p == Policy::kSync || p == Policy::kAsync;
    EXPECT_EQ(rule.PlanForward(true).exchange, traffic);
    EXPECT_EQ(rule.PlanForward(true).want_running, p == Policy::kAsync);
    EXPECT_FALSE(rule.PlanForward(false).want_running);
    EXPECT_EQ(rule.GlobalBackward(), p == Policy::kSync);
  }
}

TEST(WorkerBnTest, SyncNormalizesWithTheGlobalMoments) {
  WorkerBn rule(Policy::kSync, 0.1);
  BnForwardResult answer;
  answer.merged = M(10, {1.0, 2.0}, {3.0, 4.0});
  absl::StatusOr<BnForwardOutcome> out =
      rule.Resolve(M(4, {0.5, 0.5}, {1.0, 1.0}), answer);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->normalize.count, 10);
  EXPECT_EQ(out->normalize.mean, answer.merged.mean);
  EXPECT_TRUE(out->global_backward);
  EXPECT_EQ(out->running, RunningUpdate::kFromBatch);
}

TEST(WorkerBnTest, AsyncMergesOwnFirstAndTakesTheServersRunningStats) {
  WorkerBn rule(Policy::kAsync, 0.1);
  const bn::Moments own = M(4, {1.0}, {2.0});
  BnForwardResult answer;
  answer.merged = M(6, {3.0}, {5.0});
  answer.running = bn::RunningStats{{0.25}, {1.5}};
  absl::StatusOr<BnForwardOutcome> out = rule.Resolve(own, answer);
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<bn::Moments> want = bn::MergeMoments({own, answer.merged});
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(out->normalize.count, 10);
  EXPECT_EQ(out->normalize.mean, want->mean);  // bitwise: own first
  EXPECT_EQ(out->normalize.m2, want->m2);
  EXPECT_FALSE(out->global_backward);
  EXPECT_EQ(out->running, RunningUpdate::kFromServers);
  ASSERT_TRUE(out->servers_running.has_value());
  EXPECT_EQ(out->servers_running->var, std::vector<double>{1.5});

  answer.running.reset();  // not asked for: nothing to take
  out = rule.Resolve(own, answer);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->running, RunningUpdate::kNone);

  answer.merged = M(6, {3.0, 1.0}, {5.0, 1.0});  // another channel count
  EXPECT_EQ(rule.Resolve(own, answer).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorkerBnTest, LocalAndRecalNormalizeWithTheirOwnMoments) {
  for (Policy p : {Policy::kLocal, Policy::kRecal}) {
    WorkerBn rule(p, 0.1);
    const bn::Moments own = M(4, {1.0}, {2.0});
    absl::StatusOr<BnForwardOutcome> out = rule.Resolve(own, std::nullopt);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->normalize.mean, own.mean);
    EXPECT_EQ(out->running, RunningUpdate::kFromBatch);
    EXPECT_FALSE(out->global_backward);
  }
}

TEST(WorkerBnTest, AnAnswerThatDoesNotMatchThePlanIsRefused) {
  BnForwardResult answer;
  answer.merged = M(1, {1.0}, {0.0});
  EXPECT_EQ(WorkerBn(Policy::kLocal, 0.1)
                .Resolve(M(1, {1.0}, {0.0}), answer)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WorkerBn(Policy::kSync, 0.1)
                .Resolve(M(1, {1.0}, {0.0}), std::nullopt)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorkerBnTest, AsyncNeedsTheJobsMomentumWhenTracking) {
  WorkerBn rule(Policy::kAsync, 0.1);
  EXPECT_TRUE(rule.CheckLayer("l", true, 0.1).ok());
  EXPECT_TRUE(rule.CheckLayer("l", false, 0.5).ok());  // servers keep none
  absl::Status s = rule.CheckLayer("l", true, 0.5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'l'"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("--bn_momentum=0.5"), absl::string_view::npos);
  EXPECT_FALSE(rule.CheckLayer("l", true, std::nullopt).ok());
  for (Policy p : {Policy::kSync, Policy::kLocal, Policy::kRecal}) {
    EXPECT_TRUE(WorkerBn(p, 0.1).CheckLayer("l", true, 0.5).ok());
  }
}

TEST(WorkerBnTest, SettlingFollowsThePolicy) {
  EXPECT_EQ(*WorkerBn(Policy::kSync, 0.1).SettleRunning(),
            RunningSettle::kNothing);
  EXPECT_EQ(*WorkerBn(Policy::kLocal, 0.1).SettleRunning(),
            RunningSettle::kWorkersAverage);
  EXPECT_EQ(*WorkerBn(Policy::kAsync, 0.1).SettleRunning(),
            RunningSettle::kServers);
  EXPECT_EQ(WorkerBn(Policy::kRecal, 0.1).SettleRunning().status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(WorkerBnTest, FromConfigReadsPolicyAndMomentum) {
  proto::JobConfig c;
  policy::ToConfig({Policy::kAsync, policy::Gradients::kAsync}, &c);
  c.set_bn_momentum(0.25);
  absl::StatusOr<WorkerBn> rule = WorkerBn::FromConfig(c);
  ASSERT_TRUE(rule.ok()) << rule.status();
  EXPECT_EQ(rule->policy(), Policy::kAsync);
  EXPECT_TRUE(rule->CheckLayer("l", true, 0.25).ok());
  EXPECT_FALSE(WorkerBn::FromConfig(proto::JobConfig()).ok());
}

TEST(WorkerBnTest, UpdateRunningIsTorchsRule) {
  bn::RunningStats running = bn::RunningStats::Initial(1);
  int64_t tracked = 0;
  const bn::Moments batch = M(5, {2.0}, {8.0});  // unbiased var 2
  ASSERT_TRUE(UpdateRunning(batch, 0.5, &tracked, &running).ok());
  EXPECT_EQ(tracked, 1);
  EXPECT_DOUBLE_EQ(running.mean[0], 1.0);
  EXPECT_DOUBLE_EQ(running.var[0], 1.5);
  // Momentum None: the cumulative average (m = 1 / batches tracked).
  running = bn::RunningStats::Initial(1);
  tracked = 1;
  ASSERT_TRUE(UpdateRunning(batch, std::nullopt, &tracked, &running).ok());
  EXPECT_EQ(tracked, 2);
  EXPECT_DOUBLE_EQ(running.mean[0], 1.0);
  // An empty batch changes nothing; one sample per channel is refused.
  ASSERT_TRUE(UpdateRunning(bn::Moments::Empty(1), 0.5, &tracked, &running)
                  .ok());
  EXPECT_EQ(tracked, 2);
  absl::Status s = UpdateRunning(M(1, {1.0}, {0.0}), 0.5, &tracked, &running);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("more than 1 value"), absl::string_view::npos);
  EXPECT_EQ(tracked, 2);
}

TEST(WorkerBnTest, ApplyRunningFollowsTheOutcome) {
  BnForwardOutcome out;
  out.normalize = M(5, {2.0}, {8.0});
  bn::RunningStats running = bn::RunningStats::Initial(1);
  int64_t tracked = 0;
  ASSERT_TRUE(ApplyRunning(out, 0.5, &tracked, &running).ok());  // kNone
  EXPECT_EQ(tracked, 0);
  EXPECT_EQ(running.mean[0], 0.0);
  out.running = RunningUpdate::kFromBatch;
  ASSERT_TRUE(ApplyRunning(out, 0.5, &tracked, &running).ok());
  EXPECT_EQ(tracked, 1);
  EXPECT_DOUBLE_EQ(running.var[0], 1.5);
  out.running = RunningUpdate::kFromServers;
  EXPECT_EQ(ApplyRunning(out, 0.5, &tracked, &running).code(),
            absl::StatusCode::kInvalidArgument);  // no statistics came
  out.servers_running = bn::RunningStats{{0.25, 0.5}, {2.0, 3.0}};
  EXPECT_EQ(ApplyRunning(out, 0.5, &tracked, &running).code(),
            absl::StatusCode::kInvalidArgument);  // two channels for one
  out.servers_running = bn::RunningStats{{0.25}, {2.0}};
  ASSERT_TRUE(ApplyRunning(out, 0.5, &tracked, &running).ok());
  EXPECT_EQ(tracked, 2);
  EXPECT_EQ(running.mean[0], 0.25);
  EXPECT_EQ(running.var[0], 2.0);
}

// Forward runs the whole sequence: under async with a tracked layer it asks
// the one-worker job's servers, takes their running statistics and counts
// the batch; under local it never asks for a client; a layer the policy
// refuses, or a client that cannot be had, stops it before any exchange.
TEST(WorkerBnTest, ForwardRunsTheWholeSequenceThroughOneClient) {
  server::ShardOptions o;
  o.num_workers = 1;
  o.policy = Policy::kAsync;
  o.bn_momentum = 0.25;
  auto job = test::InProcessJob::Create(o, 1);
  ASSERT_TRUE(job.ok()) << job.status();
  auto client = test::InProcessPsClient::Connect(job->get(), 0);
  ASSERT_TRUE(client.ok()) << client.status();
  int calls = 0;
  auto get = [&]() -> absl::StatusOr<PsClient*> {
    ++calls;
    return client->get();
  };
  const bn::Moments local = M(4, {1.0, -2.0}, {3.0, 5.0});
  bn::RunningStats running{{0.0, 0.0}, {1.0, 1.0}};
  int64_t tracked = 0;
  bool exchanged = false;
  const WorkerBn async(Policy::kAsync, 0.25);
  absl::StatusOr<BnForwardOutcome> out = async.Forward(
      get, "bn", 0, local, LayerRunning{0.25, &tracked, &running},
      &exchanged);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(exchanged);
  EXPECT_EQ(out->running, RunningUpdate::kFromServers);
  ASSERT_TRUE(out->servers_running.has_value());
  EXPECT_EQ(running.mean, out->servers_running->mean);
  EXPECT_EQ(running.var, out->servers_running->var);
  EXPECT_NE(running.mean, (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(tracked, 1);

  // Another momentum than the job's: refused before any call.
  out = async.Forward(get, "bn", 1, local,
                      LayerRunning{0.5, &tracked, &running});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);

  // Local: its own moments, its own running update, no client.
  bn::RunningStats mine{{0.0, 0.0}, {1.0, 1.0}};
  int64_t mine_tracked = 0;
  exchanged = false;
  out = WorkerBn(Policy::kLocal, 0.25)
            .Forward(get, "bn", 0, local,
                     LayerRunning{std::nullopt, &mine_tracked, &mine},
                     &exchanged);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(exchanged);
  EXPECT_EQ(out->normalize.mean, local.mean);
  EXPECT_EQ(mine_tracked, 1);
  EXPECT_EQ(mine.mean, local.mean);  // the cumulative average of one batch

  // A client that cannot be had: its error, as it gives it.
  out = WorkerBn(Policy::kSync, 0.25)
            .Forward([]() -> absl::StatusOr<PsClient*> {
              return absl::FailedPreconditionError("closed");
            }, "bn", 0, local);
  EXPECT_EQ(out.status(), absl::FailedPreconditionError("closed"));
}

}  // namespace
}  // namespace bnps::client
