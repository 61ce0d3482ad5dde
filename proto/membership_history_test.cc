#include "proto/membership_history.h"

#include "gtest/gtest.h"

namespace bnps::proto {
namespace {

using Segment = MembershipHistory::Segment;

TEST(MembershipHistoryTest, WorkersAtFollowsTheSegments) {
  absl::StatusOr<MembershipHistory> h = MembershipHistory::Parse("0:2,10:4,20:2");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->WorkersAt(-1), 2);
  EXPECT_EQ(h->WorkersAt(0), 2);
  EXPECT_EQ(h->WorkersAt(9), 2);
  EXPECT_EQ(h->WorkersAt(10), 4);
  EXPECT_EQ(h->WorkersAt(19), 4);
  EXPECT_EQ(h->WorkersAt(20), 2);
  EXPECT_EQ(h->WorkersAt(1'000'000), 2);
  EXPECT_EQ(h->base_workers(), 2);
  EXPECT_EQ(h->max_workers(), 4);
  EXPECT_EQ(h->MaxWorkersFrom(0), 4);
  EXPECT_EQ(h->MaxWorkersFrom(15), 4);
  EXPECT_EQ(h->MaxWorkersFrom(20), 2);
  EXPECT_EQ(h->ToString(), "0:2,10:4,20:2");
}

TEST(MembershipHistoryTest, MalformedHistoriesAreRefused) {
  for (const char* bad : {"", "1:2", "0:2,0:3", "0:2,5:3,4:2", "0:0", "0:2,3:-1",
                          "0:2;3:4", "x:2", "0:2:3", "0:70000"}) {
    absl::StatusOr<MembershipHistory> h = MembershipHistory::Parse(bad);
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(MembershipHistory::Create({}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MembershipHistoryTest, ResizeAppendsReplacesAndRefusesThePast) {
  MembershipHistory h(2);
  ASSERT_TRUE(h.ResizeAt(10, 4).ok());
  EXPECT_EQ(h.ToString(), "0:2,10:4");
  // A second request for the same step (before it began) replaces it.
  ASSERT_TRUE(h.ResizeAt(10, 3).ok());
  EXPECT_EQ(h.ToString(), "0:2,10:3");
  // ... and a request back to the count in force removes the segment.
  ASSERT_TRUE(h.ResizeAt(10, 2).ok());
  EXPECT_EQ(h.ToString(), "0:2");
  ASSERT_TRUE(h.ResizeAt(10, 4).ok());
  // The count in force adds nothing.
  ASSERT_TRUE(h.ResizeAt(15, 4).ok());
  EXPECT_EQ(h.ToString(), "0:2,10:4");
  // A step before the last fixed one cannot change.
  const absl::Status past = h.ResizeAt(9, 3);
  EXPECT_EQ(past.code(), absl::StatusCode::kFailedPrecondition) << past;
  EXPECT_NE(past.message().find("fixed up to step 10 (0:2,10:4)"),
            std::string::npos)
      << past;
  EXPECT_EQ(h.ResizeAt(20, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.ToString(), "0:2,10:4");  // errors change nothing
}

TEST(MembershipHistoryTest, ResizeAtStepZeroSetsTheJobsCount) {
  MembershipHistory h(2);
  ASSERT_TRUE(h.ResizeAt(0, 3).ok());
  EXPECT_EQ(h.ToString(), "0:3");
}

// A restart from a checkpoint of step N with --num_workers=W' continues the
// history exactly as a resize at N does: both runs read the same counts.
TEST(MembershipHistoryTest, RestartEqualsResize) {
  MembershipHistory elastic(2);
  ASSERT_TRUE(elastic.ResizeAt(4, 4).ok());
  ASSERT_TRUE(elastic.ResizeAt(8, 2).ok());

  MembershipHistory first(2);
  absl::StatusOr<MembershipHistory> second = first.RestartedAt(4, 4);
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<MembershipHistory> third = second->RestartedAt(8, 2);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(*third, elastic);
  for (int64_t s = 0; s < 12; ++s) {
    EXPECT_EQ(third->WorkersAt(s), elastic.WorkersAt(s)) << s;
  }
  // A restart with the count in force adds no segment.
  absl::StatusOr<MembershipHistory> same = elastic.RestartedAt(12, 2);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, elastic);
  // A restart from an older checkpoint forgets the later segments.
  absl::StatusOr<MembershipHistory> older = elastic.RestartedAt(6, 3);
  ASSERT_TRUE(older.ok());
  EXPECT_EQ(older->ToString(), "0:2,4:4,6:3");
}

TEST(MembershipHistoryTest, ConfigRoundTrip) {
  JobConfig c;
  c.set_num_workers(4);
  absl::StatusOr<MembershipHistory> one = MembershipHistory::FromConfig(c);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->ToString(), "0:4");
  one->ToConfig(&c);
  EXPECT_EQ(c.membership_size(), 0);  // a fixed job's config is unchanged

  absl::StatusOr<MembershipHistory> h = MembershipHistory::Parse("0:2,4:4,8:2");
  ASSERT_TRUE(h.ok());
  h->ToConfig(&c);
  EXPECT_EQ(c.membership_size(), 3);
  absl::StatusOr<MembershipHistory> back = MembershipHistory::FromConfig(c);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *h);

  c.set_num_workers(3);  // fewer ids than the history's largest count
  EXPECT_EQ(MembershipHistory::FromConfig(c).status().code(),
            absl::StatusCode::kInvalidArgument);
  c.set_num_workers(0);
  c.clear_membership();
  EXPECT_EQ(MembershipHistory::FromConfig(c).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MembershipHistoryTest, SameBefore) {
  const MembershipHistory a = *MembershipHistory::Parse("0:2,4:4,8:2");
  const MembershipHistory b = *MembershipHistory::Parse("0:2,4:4");
  const MembershipHistory c = *MembershipHistory::Parse("0:2");
  EXPECT_TRUE(a.SameBefore(b, 8));
  EXPECT_FALSE(a.SameBefore(b, 9));
  EXPECT_TRUE(a.SameBefore(c, 4));
  EXPECT_FALSE(a.SameBefore(c, 5));
  EXPECT_TRUE(c.SameBefore(a, 4));
  EXPECT_FALSE(c.SameBefore(a, 5));
  EXPECT_TRUE(a.SameBefore(a, 1000));
}

}  // namespace
}  // namespace bnps::proto
