// A shard of a job resized while it runs (ShardOptions::membership): its
// barriers wait for each step's workers, its checkpoints carry the history,
// and a restart may continue with another count from the checkpoint's step.

#include <stdlib.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/shard.h"
#include "server/shard_testing.h"

namespace bnps::server {
namespace {

using shard_testing::Step;
using shard_testing::Values;

proto::MembershipHistory History(const char* text) {
  absl::StatusOr<proto::MembershipHistory> h = proto::MembershipHistory::Parse(text);
  EXPECT_TRUE(h.ok()) << h.status();
  return *h;
}

class ShardResizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/shard_resize_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  ShardOptions Options(const char* membership, bool checkpoints = false) {
    ShardOptions o;
    o.num_workers = 4;
    o.membership = History(membership);
    o.policy = policy::Policy::kSync;
    o.start_ticker = false;
    o.optimizer.momentum = 0;
    if (checkpoints) {
      o.checkpoint_dir = dir_;
      o.checkpoint_every = 2;
    }
    return o;
  }

  static int64_t Version(Shard& shard) { return shard.store().GetStats().min_version; }

  std::string dir_;
};

TEST_F(ShardResizeTest, StepsWaitForTheirOwnWorkers) {
  auto shard = *Shard::Create(Options("0:2,2:4,3:1"));
  ASSERT_TRUE(*shard->store().Init("w", {2}, {0, 0}));
  // Step 0 completes with workers 0 and 1; worker 2 is not one of them.
  const absl::StatusOr<store::ParameterStore::PushResult> early =
      shard->store().Push(2, 0, "w", {2}, std::vector<float>{1, 1}, 1);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("not one of the 2 workers of step 0"),
            std::string::npos)
      << early.status();
  Step(*shard, 0, 1);
  Step(*shard, 1, 1);
  EXPECT_EQ(Version(*shard), 2);
  // Step 2 needs four workers: three are not enough.
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(shard->store().Push(w, 2, "w", {2}, std::vector<float>{1, 1}, 1).ok());
  }
  EXPECT_EQ(Version(*shard), 2);
  ASSERT_TRUE(shard->store().Push(3, 2, "w", {2}, std::vector<float>{1, 1}, 1).ok());
  EXPECT_EQ(Version(*shard), 3);
  Step(*shard, 3, 1);  // worker 0 alone
  EXPECT_EQ(Version(*shard), 4);

  // The BN barriers follow the same counts.
  std::optional<absl::StatusOr<BnAggregator::Reply>> r0, r3;
  auto into = [](std::optional<absl::StatusOr<BnAggregator::Reply>>* out) {
    return [out](const absl::StatusOr<BnAggregator::Reply>& r) { *out = r; };
  };
  bn::Moments m = bn::Moments::Empty(1);
  shard->bn().Forward(3, 4, "bn", m, absl::InfiniteFuture(), into(&r3));
  ASSERT_TRUE(r3.has_value());
  EXPECT_EQ(r3->status().code(), absl::StatusCode::kFailedPrecondition)
      << r3->status();
  shard->bn().Forward(0, 4, "bn", m, absl::InfiniteFuture(), into(&r0));
  ASSERT_TRUE(r0.has_value()) << "step 4 has one worker: no wait";
  ASSERT_TRUE(r0->ok()) << r0->status();
  EXPECT_EQ((*r0)->contributors, 1);
}

TEST_F(ShardResizeTest, OptionsAreChecked) {
  ShardOptions o = Options("0:2,5:5");  // more workers than the job's ids
  EXPECT_EQ(Shard::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options("0:2,5:4");
  o.policy = policy::Policy::kAsync;
  const absl::Status async = Shard::Create(o).status();
  EXPECT_EQ(async.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(async.message().find("resizing needs --policy=sync"),
            std::string::npos);
  o.membership = History("0:4");  // one count, the job's: nothing resizes
  EXPECT_TRUE(Shard::Create(o).ok());
  auto shard = *Shard::Create(Options("0:2,5:4"));
  EXPECT_EQ(shard->history().ToString(), "0:2,5:4");
  const proto::JobConfig c = ToJobConfig(shard->options());
  EXPECT_EQ(c.num_workers(), 4);
  ASSERT_EQ(c.membership_size(), 2);
  EXPECT_EQ(c.membership(1).from_step(), 5);
}

// A job resized at step 2 and one that stopped at its checkpoint of step 2
// and restarted with the new count end on the same bits; a restart whose
// history rewrites the steps before the checkpoint takes the checkpoint's.
TEST_F(ShardResizeTest, RestartWithANewCountEqualsTheResize) {
  std::vector<float> elastic;
  {
    auto shard = *Shard::Create(Options("0:2,2:3"));
    ASSERT_TRUE(*shard->store().Init("w", {2}, {1, 2}));
    for (int64_t s = 0; s < 4; ++s) Step(*shard, s, 0.25f * (s + 1));
    elastic = Values(*shard);
  }
  {
    auto first = *Shard::Create(Options("0:2", /*checkpoints=*/true));
    ASSERT_TRUE(*first->store().Init("w", {2}, {1, 2}));
    for (int64_t s = 0; s < 2; ++s) Step(*first, s, 0.25f * (s + 1));
    ASSERT_TRUE(first->FlushCheckpoints().ok());
  }
  {
    // Another count before the checkpoint's step: the checkpoint's
    // membership stands (the job's past is the checkpoint's).
    auto other = *Shard::Create(Options("0:2,1:3", true));
    EXPECT_EQ(other->history().ToString(), "0:2");
  }
  auto second = *Shard::Create(Options("0:2,2:3", true));
  EXPECT_EQ(second->generation().restored_step, 2);
  ASSERT_TRUE(second->Rollback(1, 2).ok());
  for (int64_t s = 2; s < 4; ++s) Step(*second, s, 0.25f * (s + 1));
  EXPECT_EQ(Values(*second), elastic);
}

// A rollback may resize the job from its step: shard 0 decides (resize_to),
// the others take shard 0's membership (adopt) if it agrees with theirs
// before the step.
TEST_F(ShardResizeTest, RollbackResizesFromItsStep) {
  {
    auto shard = *Shard::Create(Options("0:2", /*checkpoints=*/true));
    ASSERT_TRUE(*shard->store().Init("w", {2}, {1, 2}));
    for (int64_t s = 0; s < 4; ++s) Step(*shard, s, 0.25f);
    ASSERT_TRUE(shard->FlushCheckpoints().ok());
  }
  {
    auto shard = *Shard::Create(Options("0:2", true));
    Shard::MembershipChange too_many;
    too_many.resize_to = 5;
    EXPECT_EQ(shard->Rollback(1, 2, too_many).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(shard->generation().needs_rollback);  // nothing changed
    Shard::MembershipChange disagree;
    disagree.adopt = History("0:2,1:3");
    EXPECT_EQ(shard->Rollback(1, 2, disagree).status().code(),
              absl::StatusCode::kFailedPrecondition);
    Shard::MembershipChange adopt;
    adopt.adopt = History("0:2,2:3");
    ASSERT_EQ(*shard->Rollback(1, 2, adopt), 2);
    EXPECT_EQ(shard->history().ToString(), "0:2,2:3");
  }
  auto shard = *Shard::Create(Options("0:2", true));
  Shard::MembershipChange grow;
  grow.resize_to = 4;
  ASSERT_EQ(*shard->Rollback(1, 4, grow), 4);
  EXPECT_EQ(shard->history().ToString(), "0:2,4:4");
  EXPECT_EQ(shard->config().membership_size(), 2);
  // Step 4 waits for four workers now.
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(shard->store().Push(w, 4, "w", {2}, std::vector<float>{1, 1}, 1).ok());
  }
  EXPECT_EQ(Version(*shard), 4);
  ASSERT_TRUE(shard->store().Push(3, 4, "w", {2}, std::vector<float>{1, 1}, 1).ok());
  EXPECT_EQ(Version(*shard), 5);
  // The same generation again (another worker's call) changes nothing more.
  ASSERT_EQ(*shard->Rollback(1, 4, grow), 4);
  EXPECT_EQ(shard->history().ToString(), "0:2,4:4");
}

// Only the job's highest worker may leave early; the job then goes on with
// its id as the count from the rollback's step.
TEST_F(ShardResizeTest, RollbackLetsTheHighestWorkerLeave) {
  {
    auto shard = *Shard::Create(Options("0:3", true));
    ASSERT_TRUE(*shard->store().Init("w", {2}, {1, 2}));
    for (int64_t s = 0; s < 2; ++s) Step(*shard, s, 0.25f);
    ASSERT_TRUE(shard->FlushCheckpoints().ok());
  }
  auto shard = *Shard::Create(Options("0:3", true));
  Shard::MembershipChange middle;
  middle.shrink_to = 1;
  middle.leaver = 1;
  const absl::Status refused = shard->Rollback(1, 2, middle).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("only its highest worker may"),
            std::string::npos)
      << refused;
  Shard::MembershipChange top;
  top.shrink_to = 2;
  top.leaver = 2;
  ASSERT_EQ(*shard->Rollback(1, 2, top), 2);
  EXPECT_EQ(shard->history().ToString(), "0:3,2:2");
  Step(*shard, 2, 0.25f);  // two workers complete step 2
  EXPECT_EQ(Version(*shard), 3);
}

// A server restarted with its first flags after the job grew while it ran
// (a join: the membership is the checkpoints') goes on with the grown job.
TEST_F(ShardResizeTest, RestartAfterAJoinKeepsTheJoinedMembership) {
  {
    auto shard = *Shard::Create(Options("0:2", true));
    ASSERT_TRUE(*shard->store().Init("w", {2}, {1, 2}));
    for (int64_t s = 0; s < 2; ++s) Step(*shard, s, 0.25f);
    ASSERT_TRUE(shard->FlushCheckpoints().ok());
  }
  {
    auto shard = *Shard::Create(Options("0:2", true));
    Shard::MembershipChange grow;
    grow.resize_to = 3;
    ASSERT_EQ(*shard->Rollback(1, 2, grow), 2);
    for (int64_t s = 2; s < 4; ++s) Step(*shard, s, 0.25f);
    ASSERT_TRUE(shard->FlushCheckpoints().ok());
  }
  auto restarted = *Shard::Create(Options("0:2", true));
  EXPECT_EQ(restarted->generation().restored_step, 4);
  EXPECT_EQ(restarted->history().ToString(), "0:2,2:3");
}

// The job is complete when the workers of its last step finished; ids it
// no longer trains with count only if they came.
TEST_F(ShardResizeTest, CompleteWithoutIdsThatNeverCame) {
  auto shard = *Shard::Create(Options("0:2,2:4,4:2"));
  ASSERT_TRUE(shard->Register(0, 10).ok());
  ASSERT_TRUE(shard->Register(1, 11).ok());
  ASSERT_TRUE(shard->Leave(0, 10).ok());
  ASSERT_TRUE(shard->Leave(1, 11).ok());
  EXPECT_TRUE(shard->job_complete());

  auto grown = *Shard::Create(Options("0:2,2:4,4:2"));
  for (int w = 0; w < 3; ++w) ASSERT_TRUE(grown->Register(w, 10 + w).ok());
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(grown->Leave(w, 10 + w).ok());
  EXPECT_FALSE(grown->job_complete()) << "worker 2 came and has not finished";
  ASSERT_TRUE(grown->Leave(2, 12).ok());
  EXPECT_TRUE(grown->job_complete());
}

}  // namespace
}  // namespace bnps::server
