#include "server/shard.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "proto/sharding.h"

namespace bnps::server {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

struct FakeClock {
  absl::Time now = kT0;
};

ShardOptions Options(FakeClock* clock, int workers, policy::Policy policy,
                     policy::WorkerLoss loss = policy::WorkerLoss::kFail) {
  ShardOptions o;
  o.num_workers = workers;
  o.policy = policy;
  o.staleness = 1;
  o.worker_loss = loss;
  o.heartbeat_timeout = absl::Seconds(3);
  o.barrier_timeout = absl::Seconds(30);
  o.start_ticker = false;
  o.now = [clock] { return clock->now; };
  return o;
}

TEST(ShardTest, RejectsBadOptions) {
  FakeClock clock;
  ShardOptions o = Options(&clock, 2, policy::Policy::kSync);
  o.shard = 2;
  o.num_shards = 2;
  EXPECT_EQ(Shard::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(&clock, 0, policy::Policy::kSync);
  EXPECT_EQ(Shard::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(&clock, 2, policy::Policy::kSync);
  o.optimizer.learning_rate = 0;
  EXPECT_EQ(Shard::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(&clock, 2, policy::Policy::kSync);
  o.barrier_timeout = absl::ZeroDuration();
  EXPECT_EQ(Shard::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardTest, ChecksCallerAndOwnership) {
  FakeClock clock;
  ShardOptions o = Options(&clock, 2, policy::Policy::kSync);
  o.num_shards = 3;
  o.shard = 1;
  auto shard = *Shard::Create(o);
  EXPECT_TRUE(shard->CheckCaller("bnps", 1).ok());
  EXPECT_EQ(shard->CheckCaller("other", 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->CheckCaller("bnps", 2).code(), absl::StatusCode::kInvalidArgument);
  int owned = 0;
  for (int i = 0; i < 30; ++i) {
    const std::string key = "param/" + std::to_string(i);
    const bool mine = proto::ShardForKey(key, 3) == 1;
    EXPECT_EQ(shard->CheckOwned(key).ok(), mine) << key;
    owned += mine;
  }
  EXPECT_GT(owned, 0);
  EXPECT_EQ(shard->clocks(), nullptr);  // not async
}

TEST(ShardTest, LostWorkerFailsWaitersUnderFail) {
  FakeClock clock;
  auto shard = *Shard::Create(Options(&clock, 2, policy::Policy::kSync));
  ASSERT_TRUE(shard->membership().Register(0, clock.now).ok());
  ASSERT_TRUE(shard->membership().Register(1, clock.now).ok());
  ASSERT_TRUE(shard->store().Init("w", {1}, {0}).ok());
  ASSERT_TRUE(shard->store().Push(0, 0, "w", {1}, {1}, 1).ok());
  std::optional<absl::StatusOr<ParameterStore::Snapshot>> pulled;
  shard->store().Pull({}, 1, shard->Deadline(),
                      [&](auto s) { pulled = std::move(s); });
  clock.now += absl::Seconds(2);
  ASSERT_TRUE(shard->membership().Heartbeat(0, clock.now).ok());
  shard->Tick(clock.now);
  EXPECT_FALSE(pulled.has_value());
  clock.now += absl::Seconds(2);  // worker 1 silent for 4 s > 3 s
  ASSERT_TRUE(shard->membership().Heartbeat(0, clock.now).ok());
  shard->Tick(clock.now);
  ASSERT_TRUE(pulled.has_value());
  EXPECT_EQ(pulled->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pulled->status().message().find("worker 1 was lost"), std::string::npos);
  EXPECT_EQ(shard->membership().Heartbeat(1, clock.now).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ShardTest, LostWorkerIsDroppedUnderShrink) {
  FakeClock clock;
  auto shard = *Shard::Create(Options(&clock, 2, policy::Policy::kSync, policy::WorkerLoss::kShrink));
  ASSERT_TRUE(shard->membership().Register(0, clock.now).ok());
  ASSERT_TRUE(shard->membership().Register(1, clock.now).ok());
  ASSERT_TRUE(shard->store().Init("w", {1}, {0}).ok());
  ASSERT_TRUE(shard->store().Push(0, 0, "w", {1}, {1}, 1).ok());
  std::optional<absl::StatusOr<ParameterStore::Snapshot>> pulled;
  shard->store().Pull({}, 1, shard->Deadline(),
                      [&](auto s) { pulled = std::move(s); });
  clock.now += absl::Seconds(4);
  ASSERT_TRUE(shard->membership().Heartbeat(0, clock.now).ok());
  shard->Tick(clock.now);
  ASSERT_TRUE(pulled.has_value());
  ASSERT_TRUE(pulled->ok()) << pulled->status();
  EXPECT_EQ((**pulled).at("w").version, 1);
  EXPECT_EQ(shard->membership().LiveWorkers(), (std::vector<int>{0}));
}

TEST(ShardTest, BarrierDeadlineExpiresOnTick) {
  FakeClock clock;
  auto shard = *Shard::Create(Options(&clock, 2, policy::Policy::kSync));
  bn::Moments m = bn::Moments::Empty(1);
  m.count = 2;
  m.mean = {1};
  m.m2 = {1};
  std::optional<absl::StatusOr<BnAggregator::Reply>> r;
  shard->bn().Forward(0, 0, "bn", m, shard->Deadline(),
                      [&](auto s) { r = std::move(s); });
  shard->Tick(clock.now + absl::Seconds(29));
  EXPECT_FALSE(r.has_value());
  shard->Tick(clock.now + absl::Seconds(30));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(ShardTest, AsyncClocksOnShardZero) {
  FakeClock clock;
  auto shard = *Shard::Create(Options(&clock, 2, policy::Policy::kAsync));
  StepClocks* clocks = shard->clocks();
  ASSERT_NE(clocks, nullptr);
  std::optional<absl::StatusOr<int64_t>> started;
  auto start = [&](int w, int64_t step) {
    started.reset();
    clocks->StartStep(w, step, shard->Deadline(), [&](auto s) { started = s; });
  };
  start(0, 0);
  ASSERT_TRUE(started.has_value() && started->ok());
  ASSERT_TRUE(clocks->FinishStep(0, 1).ok());
  start(0, 1);  // staleness 1: worker 1 at 0 >= 1 - 1
  ASSERT_TRUE(started.has_value() && started->ok());
  ASSERT_TRUE(clocks->FinishStep(0, 2).ok());
  start(0, 2);  // needs worker 1 at >= 1: waits
  EXPECT_FALSE(started.has_value());
  ASSERT_TRUE(clocks->FinishStep(1, 1).ok());
  ASSERT_TRUE(started.has_value() && started->ok());
  EXPECT_EQ(**started, 1);
  ASSERT_TRUE(clocks->FinishStep(0, 3).ok());
  start(0, 3);
  EXPECT_FALSE(started.has_value());
  shard->Tick(clock.now + absl::Seconds(31));
  ASSERT_TRUE(started.has_value());
  EXPECT_EQ(started->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(started->status().message().find("worker 1 at clock 1"),
            std::string::npos)
      << started->status();
  EXPECT_EQ(clocks->FinishStep(0, 1).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace bnps::server
