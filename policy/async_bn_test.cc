#include "policy/async_bn.h"

#include "gtest/gtest.h"

namespace bnps::policy {
namespace {

// One-channel moments of the samples `xs`.
bn::Moments Of(std::vector<double> xs) {
  bn::Moments m = bn::Moments::Empty(1);
  for (double x : xs) {
    bn::Moments one{1, {x}, {0.0}};
    bn::MergeInto(one, &m);
  }
  return m;
}

TEST(AsyncBnTest, MergesAdmissibleLiveOthersInWorkerOrder) {
  // Worker 1 at step 5 with staleness 1: worker 0 (step 4) is admissible,
  // worker 2 (step 3) too stale, worker 3 not live, worker 4 has nothing.
  std::vector<LatestMoments> latest(5);
  latest[0] = {4, Of({1, 2})};
  latest[1] = {5, Of({10})};
  latest[2] = {3, Of({100})};
  latest[3] = {5, Of({1000})};
  std::vector<bool> live = {true, true, true, false, true};
  AsyncMerge m = MergeForAsync(latest, live, /*group=*/{}, /*self=*/1, /*step=*/5,
                               /*staleness=*/1, /*channels=*/1);
  EXPECT_EQ(m.contributors, 1);
  EXPECT_EQ(m.staleness, std::vector<int64_t>({1}));  // worker 0: 5 - 4
  EXPECT_EQ(m.others.count, 2);
  EXPECT_DOUBLE_EQ(m.others.mean[0], 1.5);
  // `all` is self plus the admissible others: {1, 2, 10}.
  EXPECT_EQ(m.all.count, 3);
  EXPECT_DOUBLE_EQ(m.all.mean[0], 13.0 / 3);

  // A larger bound admits worker 2 as well.
  AsyncMerge wide = MergeForAsync(latest, live, {}, 1, 5, 2, 1);
  EXPECT_EQ(wide.contributors, 2);
  EXPECT_EQ(wide.staleness, std::vector<int64_t>({1, 2}));
  EXPECT_EQ(wide.others.count, 3);
  EXPECT_DOUBLE_EQ(wide.others.mean[0], 103.0 / 3);
}

TEST(AsyncBnTest, GroupsAnswerWithTheGroupAndRunTheJobsStats) {
  // Groups {0, 1} and {2, 3}; worker 0 at step 5, staleness 1. Its answer
  // holds worker 1 only; the running stats' merge holds everyone admissible.
  std::vector<LatestMoments> latest(4);
  latest[0] = {5, Of({1})};
  latest[1] = {4, Of({2, 4})};
  latest[2] = {5, Of({10})};
  latest[3] = {2, Of({100})};  // too stale for either
  const std::vector<bool> live(4, true);
  AsyncMerge m = MergeForAsync(latest, live, {0, 0, 1, 1}, 0, 5, 1, 1);
  EXPECT_EQ(m.contributors, 1);
  EXPECT_EQ(m.staleness, std::vector<int64_t>({1}));
  EXPECT_EQ(m.others.count, 2);
  EXPECT_DOUBLE_EQ(m.others.mean[0], 3);
  EXPECT_EQ(m.all.count, 4);  // {1, 2, 4, 10}
  EXPECT_DOUBLE_EQ(m.all.mean[0], 17.0 / 4);
  // Worker 2's group has no admissible other.
  AsyncMerge two = MergeForAsync(latest, live, {0, 0, 1, 1}, 2, 5, 1, 1);
  EXPECT_EQ(two.contributors, 0);
  EXPECT_EQ(two.others.count, 0);
  EXPECT_EQ(two.all.count, 4);
}

TEST(AsyncBnTest, OneWorkerNormalizesWithItsOwnMoments) {
  std::vector<LatestMoments> latest(1);
  latest[0] = {0, Of({3, 5})};
  AsyncMerge m = MergeForAsync(latest, {true}, {}, 0, 0, 0, 1);
  EXPECT_EQ(m.contributors, 0);
  EXPECT_EQ(m.others.count, 0);
  absl::StatusOr<bn::Moments> n = NormalizingMoments(latest[0].moments, m.others);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->count, 2);
  EXPECT_DOUBLE_EQ(n->mean[0], 4);
  EXPECT_DOUBLE_EQ(n->m2[0], 2);
}

TEST(AsyncBnTest, NormalizingMomentsMergeOwnAndOthers) {
  absl::StatusOr<bn::Moments> n = NormalizingMoments(Of({0, 2}), Of({4}));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->count, 3);
  EXPECT_DOUBLE_EQ(n->mean[0], 2);
  EXPECT_DOUBLE_EQ(n->m2[0], 8);
}

}  // namespace
}  // namespace bnps::policy
