#include "staleness/clock_table.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bnps::staleness {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

ClockTable MakeTable(int workers, int64_t staleness) {
  absl::StatusOr<ClockTable> table = ClockTable::Create(workers, staleness);
  EXPECT_TRUE(table.ok()) << table.status();
  return *table;
}

TEST(ClockTableTest, CreateRejectsBadArguments) {
  EXPECT_EQ(ClockTable::Create(0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ClockTable::Create(-3, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ClockTable::Create(2, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ClockTable::Create(1, 0).ok());
}

TEST(ClockTableTest, StartsAllLiveAtZero) {
  ClockTable t = MakeTable(3, 2);
  EXPECT_EQ(t.num_workers(), 3);
  EXPECT_EQ(t.num_live(), 3);
  EXPECT_EQ(t.staleness(), 2);
  EXPECT_EQ(t.MinLiveClock(), 0);
  for (int w = 0; w < 3; ++w) {
    EXPECT_TRUE(t.IsLive(w));
    EXPECT_EQ(t.clock(w), 0);
    EXPECT_TRUE(t.MayStart(w, 0));
  }
}

TEST(ClockTableTest, UnknownWorkers) {
  ClockTable t = MakeTable(2, 1);
  for (int w : {-1, 2, 100}) {
    EXPECT_EQ(t.Advance(w, 1).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(t.Remove(w).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(t.MayStart(w, 0));
    EXPECT_FALSE(t.IsLive(w));
    EXPECT_EQ(t.clock(w), -1);
  }
  EXPECT_EQ(t.num_live(), 2);
}

TEST(ClockTableTest, LockStepWithZeroStaleness) {
  ClockTable t = MakeTable(2, 0);
  EXPECT_TRUE(t.MayStart(0, 0));
  ASSERT_TRUE(t.Advance(0, 1).ok());
  // Worker 0 must wait for worker 1 to finish step 0.
  EXPECT_FALSE(t.MayStart(0, 1));
  EXPECT_THAT(t.Laggards(1), ElementsAre(1));
  EXPECT_TRUE(t.MayStart(1, 0));
  ASSERT_TRUE(t.Advance(1, 1).ok());
  EXPECT_TRUE(t.MayStart(0, 1));
  EXPECT_TRUE(t.MayStart(1, 1));
  EXPECT_THAT(t.Laggards(1), IsEmpty());
}

TEST(ClockTableTest, StalenessLetsFastWorkerRunAhead) {
  ClockTable t = MakeTable(3, 2);
  // Worker 0 may run steps 0, 1, 2 while the others are at 0, not step 3.
  for (int64_t c = 0; c < 3; ++c) {
    ASSERT_TRUE(t.MayStart(0, c)) << c;
    ASSERT_TRUE(t.Advance(0, c + 1).ok());
  }
  EXPECT_FALSE(t.MayStart(0, 3));
  EXPECT_THAT(t.Laggards(3), ElementsAre(1, 2));
  ASSERT_TRUE(t.Advance(1, 1).ok());
  EXPECT_THAT(t.Laggards(3), ElementsAre(2));
  EXPECT_FALSE(t.MayStart(0, 3));
  ASSERT_TRUE(t.Advance(2, 1).ok());
  EXPECT_TRUE(t.MayStart(0, 3));
  EXPECT_EQ(t.MinLiveClock(), 1);
}

TEST(ClockTableTest, SingleWorkerNeverWaits) {
  for (int64_t s : {0, 1, 3}) {
    ClockTable t = MakeTable(1, s);
    for (int64_t c = 0; c < 50; ++c) {
      ASSERT_TRUE(t.MayStart(0, c));
      ASSERT_TRUE(t.Advance(0, c + 1).ok());
    }
    EXPECT_EQ(t.clock(0), 50);
    EXPECT_EQ(t.MinLiveClock(), 50);
  }
}

TEST(ClockTableTest, AdvanceIsIdempotentAndNeverGoesBack) {
  ClockTable t = MakeTable(2, 1);
  ASSERT_TRUE(t.Advance(0, 1).ok());
  EXPECT_TRUE(t.Advance(0, 1).ok());  // a retried RPC
  EXPECT_EQ(t.clock(0), 1);
  absl::Status back = t.Advance(0, 0);
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(back.message()), HasSubstr("already at 1"));
  EXPECT_EQ(t.Advance(0, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(t.Advance(1, 0).ok());  // same value at the start
  EXPECT_EQ(t.clock(0), 1);
  EXPECT_EQ(t.clock(1), 0);
}

TEST(ClockTableTest, AdvanceRejectsStepsTheBoundNeverAllowed) {
  ClockTable t = MakeTable(2, 1);
  // With worker 1 at 0, worker 0 may begin steps 0 and 1, so reach clock 2.
  ASSERT_TRUE(t.Advance(0, 2).ok());
  absl::Status too_far = t.Advance(0, 3);
  EXPECT_EQ(too_far.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.clock(0), 2);  // unchanged by the failure
  // A jump is judged like the steps it covers: clock 3 needs min >= 1.
  ASSERT_TRUE(t.Advance(1, 1).ok());
  EXPECT_TRUE(t.Advance(0, 3).ok());
  // Worker 1 cannot jump from 1 to 4: step 3 needs min >= 2, and min is 1.
  EXPECT_EQ(t.Advance(1, 4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(t.Advance(1, 3).ok());
}

TEST(ClockTableTest, RemoveUnblocksOthers) {
  ClockTable t = MakeTable(3, 0);
  ASSERT_TRUE(t.Advance(0, 1).ok());
  ASSERT_TRUE(t.Advance(1, 1).ok());
  EXPECT_FALSE(t.MayStart(0, 1));
  EXPECT_THAT(t.Laggards(1), ElementsAre(2));
  ASSERT_TRUE(t.Remove(2).ok());
  EXPECT_TRUE(t.MayStart(0, 1));
  EXPECT_THAT(t.Laggards(1), IsEmpty());
  EXPECT_EQ(t.num_live(), 2);
  EXPECT_EQ(t.MinLiveClock(), 1);
}

TEST(ClockTableTest, RemovedWorkerIsFrozen) {
  ClockTable t = MakeTable(2, 1);
  ASSERT_TRUE(t.Advance(1, 1).ok());
  ASSERT_TRUE(t.Remove(1).ok());
  EXPECT_TRUE(t.Remove(1).ok());  // idempotent
  EXPECT_EQ(t.num_live(), 1);
  EXPECT_FALSE(t.IsLive(1));
  EXPECT_EQ(t.clock(1), 1);
  EXPECT_FALSE(t.MayStart(1, 1));
  EXPECT_EQ(t.Advance(1, 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.Advance(1, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.clock(1), 1);
  EXPECT_THAT(t.Laggards(100), ElementsAre(0));  // removed never lag
}

TEST(ClockTableTest, RestoreNeverLowersTheSlowestClock) {
  ClockTable t = MakeTable(3, 1);
  ASSERT_TRUE(t.Remove(2).ok());
  ASSERT_TRUE(t.Restore(2).ok());  // every clock 0: nobody began anything
  EXPECT_TRUE(t.IsLive(2));
  EXPECT_EQ(t.num_live(), 3);
  EXPECT_TRUE(t.Restore(2).ok());  // live: nothing to do
  EXPECT_EQ(t.num_live(), 3);
  ASSERT_TRUE(t.Remove(2).ok());
  ASSERT_TRUE(t.Advance(0, 1).ok());
  ASSERT_TRUE(t.Advance(1, 1).ok());
  // Workers 0 and 1 may have begun step 2; worker 2 at clock 0 would forbid it.
  EXPECT_EQ(t.Restore(2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(t.IsLive(2));
  EXPECT_EQ(t.MinLiveClock(), 1);
  EXPECT_EQ(t.Restore(3).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(t.Remove(0).ok());
  ASSERT_TRUE(t.Remove(1).ok());
  EXPECT_TRUE(t.Restore(2).ok());  // nobody live to hold back
  EXPECT_EQ(t.MinLiveClock(), 0);
}

TEST(ClockTableTest, NoLiveWorkers) {
  ClockTable t = MakeTable(2, 0);
  ASSERT_TRUE(t.Remove(0).ok());
  ASSERT_TRUE(t.Remove(1).ok());
  EXPECT_EQ(t.num_live(), 0);
  EXPECT_EQ(t.MinLiveClock(), ClockTable::kNoLiveWorkers);
  EXPECT_THAT(t.Laggards(1000), IsEmpty());
  EXPECT_FALSE(t.MayStart(0, 0));  // removed workers never start
}

TEST(ClockTableTest, Admissibility) {
  // Lock step (s = 0).
  EXPECT_TRUE(Admissible(5, 5, 0));
  EXPECT_TRUE(Admissible(6, 5, 0));
  EXPECT_FALSE(Admissible(4, 5, 0));

  EXPECT_TRUE(Admissible(3, 5, 2));
  EXPECT_FALSE(Admissible(2, 5, 2));
  EXPECT_TRUE(Admissible(0, 0, 2));
  EXPECT_TRUE(Admissible(0, 2, 2));
  EXPECT_FALSE(Admissible(0, 3, 2));
}

TEST(ClockTableTest, ExtremeValuesDoNotOverflow) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  ClockTable huge = MakeTable(2, kMax);
  EXPECT_TRUE(Admissible(0, kMax, kMax));
  EXPECT_TRUE(Admissible(-1, 0, kMax));
  EXPECT_TRUE(huge.MayStart(0, kMax));
  EXPECT_TRUE(huge.Advance(0, kMax).ok());

  ClockTable t = MakeTable(1, 3);
  EXPECT_TRUE(Admissible(kMin, kMin, 3));
  EXPECT_FALSE(Admissible(kMin, 0, 3));
  EXPECT_FALSE(Admissible(0, kMax, 3));
  EXPECT_TRUE(t.MayStart(0, kMin));
}

}  // namespace
}  // namespace bnps::staleness
