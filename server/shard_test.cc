#include "server/shard.h"

#include <memory>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "proto/sharding.h"
#include "security/worker_token.h"

namespace bnps::server {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
// Incarnations: the first process of a worker, and a relaunch.
constexpr uint64_t kFirst = 11;
constexpr uint64_t kRelaunch = 22;

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
  // BN groups: the size must divide the job's workers, under sync BN.
  o = Options(&clock, 4, policy::Policy::kSync);
  o.bn_group_size = 3;
  EXPECT_EQ(Shard::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(&clock, 4, policy::Policy::kLocal);
  o.bn_group_size = 2;
  EXPECT_EQ(Shard::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(&clock, 4, policy::Policy::kSync);
  o.bn_group_size = 2;
  absl::StatusOr<std::unique_ptr<Shard>> grouped = Shard::Create(o);
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_EQ((*grouped)->config().bn_group_size(), 2);
  EXPECT_FALSE((*grouped)->config().has_bn_staleness());
  // An exact BN staleness: async BN only; in the job's config.
  o = Options(&clock, 4, policy::Policy::kSync);
  o.bn_staleness = 1;
  EXPECT_EQ(Shard::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(&clock, 4, policy::Policy::kAsync);
  o.bn_staleness = 2;
  absl::StatusOr<std::unique_ptr<Shard>> stale = Shard::Create(o);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ((*stale)->config().bn_staleness(), 2);
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
  ASSERT_TRUE(shard->Register(0, kFirst).ok());
  ASSERT_TRUE(shard->Register(1, kFirst).ok());
  ASSERT_TRUE(shard->store().Init("w", {1}, {0}).ok());
  ASSERT_TRUE(shard->store().Push(0, 0, "w", {1}, {1}, 1).ok());
  std::optional<absl::StatusOr<store::ParameterStore::Snapshot>> pulled;
  shard->store().Pull({}, 1, shard->Deadline(),
                      [&](auto s) { pulled = std::move(s); });
  clock.now += absl::Seconds(2);
  ASSERT_TRUE(shard->membership().Heartbeat(0, kFirst, clock.now).ok());
  shard->Tick(clock.now);
  EXPECT_FALSE(pulled.has_value());
  clock.now += absl::Seconds(2);  // worker 1 silent for 4 s > 3 s
  ASSERT_TRUE(shard->membership().Heartbeat(0, kFirst, clock.now).ok());
  shard->Tick(clock.now);
  ASSERT_TRUE(pulled.has_value());
  EXPECT_EQ(pulled->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pulled->status().message().find("worker 1 was lost"), std::string::npos);
  EXPECT_EQ(shard->membership().Heartbeat(1, kFirst, clock.now).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Under wait, a worker lost to a network partition (the same process, heard
// from again) is live again and the pull that waited for it completes; under
// fail its heartbeat stays refused; another process's heartbeat is refused.
TEST(ShardTest, LostWorkerHeardFromAgainGoesOnUnderWait) {
  for (policy::WorkerLoss loss :
       {policy::WorkerLoss::kWait, policy::WorkerLoss::kFail}) {
    FakeClock clock;
    auto shard = *Shard::Create(Options(&clock, 2, policy::Policy::kSync, loss));
    ASSERT_TRUE(shard->Register(0, kFirst).ok());
    ASSERT_TRUE(shard->Register(1, kFirst).ok());
    ASSERT_TRUE(shard->store().Init("w", {1}, {0}).ok());
    ASSERT_TRUE(shard->store().Push(0, 0, "w", {1}, {1}, 1).ok());
    std::optional<absl::StatusOr<store::ParameterStore::Snapshot>> pulled;
    shard->store().Pull({}, 1, shard->Deadline(),
                        [&](auto s) { pulled = std::move(s); });
    clock.now += absl::Seconds(4);  // worker 1 silent for 4 s > 3 s
    ASSERT_TRUE(shard->Heartbeat(0, kFirst).ok());
    shard->Tick(clock.now);
    ASSERT_TRUE(shard->membership().IsLost(1));
    EXPECT_EQ(shard->Heartbeat(1, kRelaunch).code(),
              absl::StatusCode::kFailedPrecondition);
    const absl::Status again = shard->Heartbeat(1, kFirst);
    if (loss == policy::WorkerLoss::kFail) {
      EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
      continue;
    }
    ASSERT_TRUE(again.ok()) << again;
    EXPECT_FALSE(shard->membership().IsLost(1));
    EXPECT_FALSE(pulled.has_value());  // it waited, and waits for the push
    ASSERT_TRUE(shard->store().Push(1, 0, "w", {1}, {1}, 1).ok());
    ASSERT_TRUE(pulled.has_value());
    EXPECT_TRUE(pulled->ok()) << pulled->status();
  }
}

TEST(ShardTest, LostWorkerIsDroppedUnderShrink) {
  FakeClock clock;
  auto shard = *Shard::Create(Options(&clock, 2, policy::Policy::kSync, policy::WorkerLoss::kShrink));
  ASSERT_TRUE(shard->Register(0, kFirst).ok());
  ASSERT_TRUE(shard->Register(1, kFirst).ok());
  ASSERT_TRUE(shard->store().Init("w", {1}, {0}).ok());
  ASSERT_TRUE(shard->store().Push(0, 0, "w", {1}, {1}, 1).ok());
  std::optional<absl::StatusOr<store::ParameterStore::Snapshot>> pulled;
  shard->store().Pull({}, 1, shard->Deadline(),
                      [&](auto s) { pulled = std::move(s); });
  clock.now += absl::Seconds(4);
  ASSERT_TRUE(shard->membership().Heartbeat(0, kFirst, clock.now).ok());
  shard->Tick(clock.now);
  ASSERT_TRUE(pulled.has_value());
  ASSERT_TRUE(pulled->ok()) << pulled->status();
  EXPECT_EQ((**pulled).at("w").version, 1);
  EXPECT_EQ(shard->membership().LiveWorkers(), (std::vector<int>{0}));
}

// Shard 1 of 2 hears from both workers; shard 0 lost worker 1, and a
// worker's heartbeat carries the news. A pull waiting for worker 1 fails at
// once under fail and completes without it under shrink, as for a loss found
// here; under wait the news is ignored (steps wait for the worker anyway).
TEST(ShardTest, AnotherShardsLossActsAtOnce) {
  for (policy::WorkerLoss mode :
       {policy::WorkerLoss::kFail, policy::WorkerLoss::kShrink,
        policy::WorkerLoss::kWait}) {
    FakeClock clock;
    ShardOptions o = Options(&clock, 2, policy::Policy::kSync, mode);
    o.num_shards = 2;
    o.shard = 1;
    auto shard = *Shard::Create(o);
    ASSERT_TRUE(shard->Register(0, kFirst).ok());
    ASSERT_TRUE(shard->Register(1, kFirst).ok());
    std::string key = "w";
    while (proto::ShardForKey(key, 2) != 1) key += "w";
    ASSERT_TRUE(shard->store().Init(key, {1}, {0}).ok());
    ASSERT_TRUE(shard->store().Push(0, 0, key, {1}, {1}, 1).ok());
    std::optional<absl::StatusOr<store::ParameterStore::Snapshot>> pulled;
    shard->store().Pull({}, 1, shard->Deadline(),
                        [&](auto s) { pulled = std::move(s); });
    const std::string said = "worker 1 was lost (no heartbeat for 3s)";
    // Its own news, another process's, and a shard outside the job: nothing.
    shard->LearnLosses({{1, kFirst, 1, said},
                        {1, kRelaunch, 0, said},
                        {1, kFirst, 7, said}});
    EXPECT_FALSE(shard->membership().IsLost(1));
    EXPECT_FALSE(pulled.has_value());
    shard->LearnLosses({{1, kFirst, 0, said}});  // no clock moved
    if (mode == policy::WorkerLoss::kWait) {
      EXPECT_FALSE(shard->membership().IsLost(1));
      EXPECT_FALSE(pulled.has_value());
      EXPECT_TRUE(shard->Losses().empty());
      continue;
    }
    ASSERT_TRUE(shard->membership().IsLost(1));
    ASSERT_TRUE(pulled.has_value());
    if (mode == policy::WorkerLoss::kFail) {
      EXPECT_EQ(pulled->status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_EQ(pulled->status().message(), "shard 0 found that " + said);
    } else {
      ASSERT_TRUE(pulled->ok()) << pulled->status();
      EXPECT_EQ(shard->membership().LiveWorkers(), (std::vector<int>{0}));
    }
    // Listed with the shard that found it and its words, to pass on.
    const std::vector<Membership::Loss> losses = shard->Losses();
    ASSERT_EQ(losses.size(), 1u);
    EXPECT_EQ(losses[0].shard, 0);
    EXPECT_EQ(losses[0].reason, said);
    EXPECT_EQ(shard->Heartbeat(1, kFirst).code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

// With the job token as seal key, a shard lists its own findings sealed,
// takes only news whose seal holds (another shard's, under the same key),
// and passes told news on with the seal it came with.
TEST(ShardTest, LossNewsNeedsTheFindersSeal) {
  constexpr char kKey[] = "job-token-0123456789abcdef";
  FakeClock clock;
  ShardOptions finder_options = Options(&clock, 2, policy::Policy::kSync);
  finder_options.num_shards = 2;
  finder_options.seal_key = kKey;
  ShardOptions told_options = finder_options;
  told_options.shard = 1;
  auto finder = *Shard::Create(finder_options);
  auto told = *Shard::Create(told_options);
  for (Shard* s : {finder.get(), told.get()}) {
    ASSERT_TRUE(s->Register(0, kFirst).ok());
    ASSERT_TRUE(s->Register(1, kFirst).ok());
  }
  clock.now += absl::Seconds(4);  // shard 0 hears from worker 0 only,
  ASSERT_TRUE(finder->Heartbeat(0, kFirst).ok());
  finder->Tick(clock.now);
  for (int w : {0, 1}) {  // shard 1 from both
    ASSERT_TRUE(told->Heartbeat(w, kFirst).ok());
  }
  std::vector<Membership::Loss> news = finder->Losses();
  ASSERT_EQ(news.size(), 1u);
  EXPECT_EQ(news[0].seal.size(), 64u);
  // Forged: no seal, another key's, words changed after sealing.
  Membership::Loss forged = news[0];
  forged.seal.clear();
  Membership::Loss other_key = news[0];
  other_key.seal = security::Seal("another-job-token-0123456",
                                  "loss:bnps:1:11:0:" + news[0].reason);
  Membership::Loss reworded = news[0];
  reworded.reason = "worker 1 was lost (trust me)";
  told->LearnLosses({forged, other_key, reworded});
  EXPECT_FALSE(told->membership().IsLost(1));
  told->LearnLosses(news);
  ASSERT_TRUE(told->membership().IsLost(1));
  const std::vector<Membership::Loss> passed_on = told->Losses();
  ASSERT_EQ(passed_on.size(), 1u);
  EXPECT_EQ(passed_on[0].shard, 0);
  EXPECT_EQ(passed_on[0].seal, news[0].seal);
}

// A loss found here is listed as this shard's.
TEST(ShardTest, OwnLossesAreListedAsThisShards) {
  FakeClock clock;
  ShardOptions o = Options(&clock, 2, policy::Policy::kSync);
  o.num_shards = 3;
  o.shard = 2;
  auto shard = *Shard::Create(o);
  ASSERT_TRUE(shard->Register(0, kFirst).ok());
  ASSERT_TRUE(shard->Register(1, kFirst).ok());
  clock.now += absl::Seconds(4);
  ASSERT_TRUE(shard->Heartbeat(0, kFirst).ok());
  shard->Tick(clock.now);
  const std::vector<Membership::Loss> losses = shard->Losses();
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_EQ(losses[0].worker, 1);
  EXPECT_EQ(losses[0].incarnation, kFirst);
  EXPECT_EQ(losses[0].shard, 2);
  EXPECT_EQ(losses[0].reason, "worker 1 was lost (no heartbeat for 3s)");
}

// Worker 1 of a 2-worker shard falls silent past the heartbeat timeout while
// worker 0 heartbeats.
void LoseWorkerOne(Shard& shard, FakeClock& clock) {
  clock.now += absl::Seconds(4);
  ASSERT_TRUE(shard.membership().Heartbeat(0, kFirst, clock.now).ok());
  shard.Tick(clock.now);
  ASSERT_TRUE(shard.membership().IsLost(1));
}

bn::Moments SomeMoments() {
  bn::Moments m = bn::Moments::Empty(1);
  m.count = 2;
  m.mean = {1};
  m.m2 = {1};
  return m;
}

// Runs a BN forward and returns its answer, which must come at once. One
// that waits is answered later (at the latest when the shard goes, after
// this returned), so the callback owns where the answer goes.
absl::StatusOr<BnAggregator::Reply> ForwardNow(Shard& shard, int worker,
                                               int64_t step) {
  auto r = std::make_shared<
      std::optional<absl::StatusOr<BnAggregator::Reply>>>();
  shard.bn().Forward(worker, step, "bn", SomeMoments(), shard.Deadline(),
                     [r](const auto& s) { *r = s; });
  if (!r->has_value()) return absl::UnknownError("no answer yet");
  return **r;
}

// --bn_group=host: the workers that register from one host form a BN
// group, fixed once all four registered; a worker that names no host, or
// another host later, is refused naming the flag; each sync forward is
// answered with its host's merge, in worker order.
TEST(ShardTest, BnGroupsByHost) {
  FakeClock clock;
  ShardOptions o = Options(&clock, 4, policy::Policy::kSync);
  o.bn_group_by_host = true;
  o.bn_group_size = 2;  // one way of forming groups at a time
  EXPECT_EQ(Shard::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.bn_group_size = 0;
  absl::StatusOr<std::unique_ptr<Shard>> made = Shard::Create(o);
  ASSERT_TRUE(made.ok()) << made.status();
  Shard& shard = **made;
  EXPECT_TRUE(shard.config().bn_group_by_host());
  const absl::Status none = shard.Register(0, 11, "");
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("--bn_group=host"), std::string::npos) << none;
  const std::vector<std::string> hosts = {"b", "a", "b", "a"};
  for (int w = 0; w < 4; ++w) {
    ASSERT_TRUE(shard.Register(w, 11 + w, hosts[w]).ok()) << w;
  }
  EXPECT_TRUE(shard.Register(1, 12, "a").ok());  // a retry
  const absl::Status moved = shard.Register(1, 12, "b");
  EXPECT_EQ(moved.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(moved.message().find("--bn_group=host"), std::string::npos) << moved;
  auto moments = [](int w) {
    bn::Moments m = bn::Moments::Empty(1);
    m.count = 2 + w;
    m.mean = {1e6 + 0.3 * w};
    m.m2 = {1.0 + w};
    return m;
  };
  std::vector<std::shared_ptr<std::optional<absl::StatusOr<BnAggregator::Reply>>>>
      got;
  for (int w : {3, 1, 0, 2}) {
    got.push_back(std::make_shared<
                  std::optional<absl::StatusOr<BnAggregator::Reply>>>());
    shard.bn().Forward(w, 0, "bn", moments(w), shard.Deadline(),
                       [r = got.back()](const auto& s) { *r = s; });
  }
  const std::vector<int> order = {3, 1, 0, 2};
  for (size_t i = 0; i < order.size(); ++i) {
    const int w = order[i];
    ASSERT_TRUE(got[i]->has_value() && (*got[i])->ok()) << w;
    const bn::Moments first = moments(w % 2), second = moments(w % 2 + 2);
    const bn::Moments want = bn::MergeInOrder({&first, &second}, 1);
    const BnAggregator::Reply& r = ***got[i];
    EXPECT_EQ(r.contributors, 2) << w;
    EXPECT_EQ(r.moments.count, want.count) << w;
    EXPECT_EQ(r.moments.mean, want.mean) << w;
    EXPECT_EQ(r.moments.m2, want.m2) << w;
  }
}

// The BN policy and the gradient mode are independent: each half of a
// crossed pair behaves as in its shorthand.
TEST(ShardTest, CrossedPairsSplitBnFromGradients) {
  struct Case {
    policy::Policy bn;
    policy::Gradients gradients;
  };
  for (const Case& c : {Case{policy::Policy::kAsync, policy::Gradients::kSync},
                        Case{policy::Policy::kSync, policy::Gradients::kAsync}}) {
    SCOPED_TRACE(policy::JobPolicyName({c.bn, c.gradients}));
    FakeClock clock;
    ShardOptions o = Options(&clock, 2, c.bn);
    o.gradients = c.gradients;
    auto shard = *Shard::Create(o);
    const bool async_gradients = c.gradients == policy::Gradients::kAsync;
    // The clocks are a gradient decision.
    EXPECT_EQ(shard->clocks() != nullptr, async_gradients);
    const proto::JobConfig config = ToJobConfig(o);
    EXPECT_EQ(config.policy(), policy::ToProto(c.bn));
    EXPECT_EQ(config.gradients(), async_gradients ? proto::GRADIENTS_ASYNC
                                                  : proto::GRADIENTS_SYNC);
    ASSERT_TRUE(shard->Register(0, kFirst).ok());
    ASSERT_TRUE(shard->Register(1, kFirst).ok());
    ASSERT_TRUE(shard->store().Init("w", {1}, {0}).ok());
    // BN: async answers worker 0 alone at once; sync waits for worker 1.
    const absl::StatusOr<BnAggregator::Reply> bn = ForwardNow(*shard, 0, 0);
    EXPECT_EQ(bn.ok(), c.bn == policy::Policy::kAsync) << bn.status();
    // Gradients: async applies worker 0's push on arrival; sync waits for
    // the step's other push.
    ASSERT_TRUE(shard->store().Push(0, 0, "w", {1}, {1}, 1).ok());
    std::optional<absl::StatusOr<store::ParameterStore::Snapshot>> pulled;
    shard->store().Pull({"w"}, 1, shard->Deadline(),
                        [&](auto s) { pulled = std::move(s); });
    EXPECT_EQ(pulled.has_value(), async_gradients);
    ASSERT_TRUE(shard->store().Push(1, 0, "w", {1}, {1}, 1).ok());
    EXPECT_TRUE(pulled.has_value());
  }
  // A shorthand pair leaves the field unset (configs and checkpoints as
  // before it).
  FakeClock clock;
  for (policy::Policy p : {policy::Policy::kSync, policy::Policy::kAsync,
                           policy::Policy::kRecal}) {
    ShardOptions o = Options(&clock, 2, p);
    o.gradients = policy::ShorthandGradients(p);
    EXPECT_EQ(ToJobConfig(o).gradients(), proto::GRADIENTS_UNSPECIFIED);
    EXPECT_EQ(ToJobConfig(o).SerializeAsString(),
              ToJobConfig(Options(&clock, 2, p)).SerializeAsString());
  }
}

TEST(ShardTest, LostWorkerChangesNothing) {
  // async, where pushes apply on arrival, under either choice.
  for (policy::WorkerLoss loss :
       {policy::WorkerLoss::kFail, policy::WorkerLoss::kShrink}) {
    FakeClock clock;
    auto shard =
        *Shard::Create(Options(&clock, 2, policy::Policy::kAsync, loss));
    ASSERT_TRUE(shard->Register(0, kFirst).ok());
    ASSERT_TRUE(shard->Register(1, kFirst).ok());
    ASSERT_TRUE(shard->store().Init("w", {1}, {0}).ok());
    ASSERT_TRUE(shard->store().Push(1, 0, "w", {1}, {1}, 1).ok());
    ASSERT_TRUE(shard->clocks()->FinishStep(1, 1).ok());
    LoseWorkerOne(*shard, clock);
    // Resumed (SIGCONT), it goes on: nothing it sends is taken.
    const absl::StatusOr<store::ParameterStore::PushResult> push =
        shard->store().Push(1, 1, "w", {1}, {1}, 1);
    EXPECT_EQ(push.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(shard->store().CheckPush(1, 1, "w", {1}).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(ForwardNow(*shard, 1, 1).status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(shard->clocks()->FinishStep(1, 2).code(),
              absl::StatusCode::kFailedPrecondition);
    std::optional<absl::StatusOr<int64_t>> started;
    shard->clocks()->StartStep(1, 1, shard->Deadline(),
                               [&](auto s) { started = s; });
    ASSERT_TRUE(started.has_value());
    EXPECT_EQ(started->status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(shard->clocks()->clock(1), 1);
    EXPECT_EQ(shard->membership().Heartbeat(1, kFirst, clock.now).code(),
              absl::StatusCode::kFailedPrecondition);
    // Only its push of step 0 was applied.
    std::optional<absl::StatusOr<store::ParameterStore::Snapshot>> pulled;
    shard->store().Pull({"w"}, 0, shard->Deadline(),
                        [&](auto s) { pulled = std::move(s); });
    ASSERT_TRUE(pulled.has_value() && pulled->ok());
    EXPECT_EQ((**pulled).at("w").version, 1);
    // The others go on.
    EXPECT_TRUE(shard->store().Push(0, 0, "w", {1}, {1}, 1).ok());
  }
}

TEST(ShardTest, SameWorkerTwiceIsRefusedWhileTheFirstIsLive) {
  FakeClock clock;
  auto shard = *Shard::Create(Options(&clock, 2, policy::Policy::kSync));
  ASSERT_TRUE(shard->Register(0, kFirst).ok());
  ASSERT_TRUE(shard->Register(1, kFirst).ok());
  EXPECT_TRUE(shard->Register(1, kFirst).ok());  // a retry
  const absl::Status twice = shard->Register(1, kRelaunch);
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("worker 1 is already registered"),
            std::string::npos)
      << twice;
  EXPECT_EQ(shard->membership().Heartbeat(1, kRelaunch, clock.now).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(shard->membership().Heartbeat(1, kFirst, clock.now).ok());
  EXPECT_EQ(shard->Register(1, 0).code(), absl::StatusCode::kInvalidArgument);
  // Once the first is lost, a restart may take its place (it never took
  // part), and the first is told it was replaced.
  LoseWorkerOne(*shard, clock);
  ASSERT_TRUE(shard->Register(1, kRelaunch).ok());
  EXPECT_EQ(shard->membership().Heartbeat(1, kFirst, clock.now).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(shard->membership().Heartbeat(1, kRelaunch, clock.now).ok());
}

TEST(ShardTest, LostWorkerThatNeverTookPartMayRejoin) {
  for (policy::WorkerLoss loss :
       {policy::WorkerLoss::kFail, policy::WorkerLoss::kShrink}) {
    FakeClock clock;
    auto shard =
        *Shard::Create(Options(&clock, 2, policy::Policy::kSync, loss));
    ASSERT_TRUE(shard->store().Init("w", {1}, {0}).ok());
    ASSERT_TRUE(shard->Register(0, kFirst).ok());
    ASSERT_TRUE(shard->Register(1, kFirst).ok());  // then exits at once
    LoseWorkerOne(*shard, clock);
    ASSERT_TRUE(shard->Register(1, kRelaunch).ok());
    EXPECT_EQ(shard->membership().LiveWorkers(), (std::vector<int>{0, 1}));
    // It counts again: a step needs it, and takes what it sends.
    ASSERT_TRUE(shard->store().Push(0, 0, "w", {1}, {1}, 1).ok());
    std::optional<absl::StatusOr<BnAggregator::Reply>> fwd;
    shard->bn().Forward(0, 0, "bn", SomeMoments(), shard->Deadline(),
                        [&](const auto& r) { fwd = r; });
    EXPECT_FALSE(fwd.has_value());
    ASSERT_TRUE(ForwardNow(*shard, 1, 0).ok());
    ASSERT_TRUE(fwd.has_value() && fwd->ok()) << fwd->status();
    EXPECT_EQ((*fwd)->contributors, 2);
    ASSERT_TRUE(shard->store().Push(1, 0, "w", {1}, {1}, 1).ok());
    EXPECT_EQ(shard->store().GetStats().min_version, 1);
  }
}

TEST(ShardTest, LostWorkerThatTookPartStaysLost) {
  FakeClock clock;
  auto shard = *Shard::Create(Options(&clock, 2, policy::Policy::kAsync));
  ASSERT_TRUE(shard->store().Init("w", {1}, {0}).ok());
  ASSERT_TRUE(shard->Register(0, kFirst).ok());
  ASSERT_TRUE(shard->Register(1, kFirst).ok());
  ASSERT_TRUE(shard->store().Push(1, 0, "w", {1}, {1}, 1).ok());
  LoseWorkerOne(*shard, clock);
  const absl::Status again = shard->Register(1, kRelaunch);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("after it took part in the job (shard 0 "
                                 "holds its gradients)"),
            std::string::npos)
      << again;
  EXPECT_TRUE(shard->membership().IsLost(1));
  EXPECT_EQ(shard->store().Push(1, 1, "w", {1}, {1}, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // BN statistics and a clock count as taking part too.
  for (int what = 0; what < 2; ++what) {
    FakeClock c2;
    auto s2 = *Shard::Create(Options(&c2, 2, policy::Policy::kAsync));
    ASSERT_TRUE(s2->Register(0, kFirst).ok());
    ASSERT_TRUE(s2->Register(1, kFirst).ok());
    if (what == 0) {
      ASSERT_TRUE(ForwardNow(*s2, 1, 0).ok());
    } else {
      ASSERT_TRUE(s2->clocks()->FinishStep(1, 1).ok());
    }
    LoseWorkerOne(*s2, c2);
    EXPECT_EQ(s2->Register(1, kRelaunch).code(),
              absl::StatusCode::kFailedPrecondition)
        << what;
  }
}

TEST(ShardTest, UnderShrinkALostWorkerRejoinsOnlyBeforeTheJobBegan) {
  FakeClock clock;
  auto shard = *Shard::Create(
      Options(&clock, 2, policy::Policy::kSync, policy::WorkerLoss::kShrink));
  ASSERT_TRUE(shard->store().Init("w", {1}, {0}).ok());
  ASSERT_TRUE(shard->Register(0, kFirst).ok());
  ASSERT_TRUE(shard->Register(1, kFirst).ok());
  LoseWorkerOne(*shard, clock);
  // Worker 0 goes on alone: its step completes without worker 1.
  ASSERT_TRUE(shard->store().Push(0, 0, "w", {1}, {1}, 1).ok());
  EXPECT_EQ(shard->store().GetStats().min_version, 1);
  const absl::Status again = shard->Register(1, kRelaunch);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("begun without it"), std::string::npos)
      << again;
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
