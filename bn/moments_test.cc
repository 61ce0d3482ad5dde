#include "bn/moments.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bn/cpu_kernels.h"
#include "bn/reference.h"
#include "gtest/gtest.h"

namespace bnps::bn {
namespace {

using reference::ComputeStats;
using reference::RandomTensor;
using reference::SliceBatch;

Moments MomentsOf(const std::vector<float>& x, const Shape& shape) {
  absl::StatusOr<Moments> m = NewCpuBnKernels()->ComputeMoments(x.data(), shape);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

double RelErr(double got, double want) {
  return std::fabs(got - want) / std::max(std::fabs(want), 1e-300);
}

// Splits `shape` along N at `cuts` and returns the parts' moments.
std::vector<Moments> PartsOf(const std::vector<float>& x, const Shape& shape,
                             const std::vector<int64_t>& sizes) {
  std::vector<Moments> parts;
  int64_t begin = 0;
  for (int64_t size : sizes) {
    Shape part_shape = shape;
    part_shape.n = size;
    parts.push_back(
        MomentsOf(SliceBatch(x, shape, begin, begin + size), part_shape));
    begin += size;
  }
  EXPECT_EQ(begin, shape.n);
  return parts;
}

TEST(MomentsTest, MergeOfUnevenPartsMatchesWholeBatch) {
  const Shape shape{23, 5, 3, 4};
  const std::vector<float> x = RandomTensor(shape, 2.0, 3.0, 7, 0.5);
  const reference::Stats want = ComputeStats(x, shape);
  // Uneven parts, some empty.
  const std::vector<Moments> parts = PartsOf(x, shape, {0, 7, 1, 0, 15});
  absl::StatusOr<Moments> merged = MergeMoments(parts);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->count, want.count);
  for (int c = 0; c < shape.c; ++c) {
    EXPECT_LT(RelErr(merged->mean[c], want.mean[c]), 1e-12) << c;
    EXPECT_LT(RelErr(merged->m2[c], want.m2[c]), 1e-12) << c;
  }
}

TEST(MomentsTest, AllZeroCountsMergeToEmpty) {
  absl::StatusOr<Moments> merged =
      MergeMoments({Moments::Empty(3), Moments::Empty(3)});
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->count, 0);
  EXPECT_EQ(merged->mean, std::vector<double>(3, 0.0));
  EXPECT_EQ(BiasedVariance(*merged), std::vector<double>(3, 0.0));
}

// The case sum / sum-of-squares in float32 gets wrong: mean 1e4, std 1.
TEST(MomentsTest, LargeMeanSmallStdStaysExact) {
  const Shape shape{64, 3, 8, 8};
  const std::vector<float> x = RandomTensor(shape, 1e4, 1.0, 11);
  const reference::Stats want = ComputeStats(x, shape);
  const std::vector<Moments> parts = PartsOf(x, shape, {5, 0, 30, 29});
  absl::StatusOr<Moments> merged = MergeMoments(parts);
  ASSERT_TRUE(merged.ok());
  const std::vector<double> var = BiasedVariance(*merged);

  // What plain data parallelism often does: per-worker float32 sum and sum of
  // squares, added up, var = E[x^2] - E[x]^2.
  double worst_naive = 0, worst_ours = 0;
  for (int c = 0; c < shape.c; ++c) {
    float sum = 0, sum_sq = 0;
    for (double v : reference::Channel(x, shape, c)) {
      sum += static_cast<float>(v);
      sum_sq += static_cast<float>(v) * static_cast<float>(v);
    }
    const float n = static_cast<float>(want.count);
    const float naive_var = sum_sq / n - (sum / n) * (sum / n);
    worst_naive = std::max(worst_naive, RelErr(naive_var, want.var[c]));

    EXPECT_LT(RelErr(merged->mean[c], want.mean[c]), 1e-12) << c;
    EXPECT_LT(RelErr(var[c], want.var[c]), 1e-6) << c;
    worst_ours = std::max(worst_ours, RelErr(var[c], want.var[c]));
  }
  // Documented in docs/bn.md: the naive variance is off by orders of magnitude
  // (typically a relative error of 10 to 1000); ours is within 1e-6.
  std::printf("variance relative error: naive float32 sum/sum-of-squares %.3g, "
              "bnps merge %.3g\n",
              worst_naive, worst_ours);
  EXPECT_GT(worst_naive, 0.5);
}

TEST(MomentsTest, OrderedMergerIsIndependentOfArrivalOrder) {
  const Shape shape{40, 6, 2, 3};
  const std::vector<float> x = RandomTensor(shape, -3.0, 2.0, 5, 1.0);
  const std::vector<Moments> parts = PartsOf(x, shape, {3, 9, 0, 11, 1, 16});
  std::vector<int> order(parts.size());
  std::iota(order.begin(), order.end(), 0);

  OrderedMerger first(parts.size(), shape.c);
  for (int slot : order) ASSERT_TRUE(first.Add(slot, parts[slot]).ok());
  const Moments want = first.Merge();

  std::mt19937 rng(3);
  bool saw_difference_without_order = false;
  for (int trial = 0; trial < 20; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    OrderedMerger merger(parts.size(), shape.c);
    std::vector<Moments> arrival_order;
    for (int slot : order) {
      ASSERT_TRUE(merger.Add(slot, parts[slot]).ok());
      arrival_order.push_back(parts[slot]);
    }
    const Moments got = merger.Merge();
    EXPECT_EQ(got.count, want.count);
    // Bitwise equality, not a tolerance.
    EXPECT_EQ(got.mean, want.mean);
    EXPECT_EQ(got.m2, want.m2);
    // Merging in arrival order instead is not bitwise stable, which is why the
    // merger exists.
    absl::StatusOr<Moments> unordered = MergeMoments(arrival_order);
    if (unordered->m2 != want.m2 || unordered->mean != want.mean) {
      saw_difference_without_order = true;
    }
  }
  EXPECT_TRUE(saw_difference_without_order);
}

TEST(MomentsTest, MergeInOrderSkipsNullsAndIsTheOrderedMergersMerge) {
  const Shape shape{12, 4, 2, 2};
  const std::vector<float> x = RandomTensor(shape, 1.0, 2.0, 11, 1.0);
  const std::vector<Moments> parts = PartsOf(x, shape, {3, 4, 5});
  OrderedMerger merger(4, shape.c);
  ASSERT_TRUE(merger.Add(2, parts[1]).ok());
  ASSERT_TRUE(merger.Add(0, parts[0]).ok());
  ASSERT_TRUE(merger.Add(3, parts[2]).ok());
  const Moments got =
      MergeInOrder({&parts[0], nullptr, &parts[1], &parts[2]}, shape.c);
  const Moments want = merger.Merge();
  EXPECT_EQ(got.count, want.count);
  EXPECT_EQ(got.mean, want.mean);  // bitwise
  EXPECT_EQ(got.m2, want.m2);
  absl::StatusOr<Moments> listed = MergeMoments(parts);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->mean, got.mean);
  // Nothing with a positive count: the empty moments of those channels.
  const Moments zero = Moments::Empty(shape.c);
  const Moments none = MergeInOrder({nullptr, &zero}, shape.c);
  EXPECT_EQ(none.count, 0);
  EXPECT_EQ(none.channels(), shape.c);
}

TEST(MomentsTest, OrderedMergerRejectsBadInput) {
  OrderedMerger merger(2, 3);
  Moments good = Moments::Empty(3);
  good.count = 2;
  good.mean = {1, 2, 3};
  good.m2 = {0.5, 0.5, 0.5};
  EXPECT_EQ(merger.Add(2, good).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(merger.Add(-1, good).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(merger.Add(0, Moments::Empty(4)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(merger.Add(0, good).ok());
  Moments other = good;
  other.mean = {9, 9, 9};
  EXPECT_EQ(merger.Add(0, other).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(merger.Merge().mean, good.mean);  // the first value is kept
  EXPECT_TRUE(merger.Has(0));
  EXPECT_FALSE(merger.Has(1));
  EXPECT_EQ(merger.num_filled(), 1);
}

// A wide layer goes through the vectorized pass; each defect is still found,
// wherever it is, and the message names its channel.
TEST(MomentsTest, ValidateFindsEachDefectOfAWideLayer) {
  Moments m = Moments::Empty(1027);
  m.count = 5;
  m.mean.assign(1027, 0.5);
  m.m2.assign(1027, 1.0);
  m.m2[7] = -0.0;  // not negative
  ASSERT_TRUE(ValidateMoments(m).ok());
  for (size_t c : {size_t{0}, size_t{513}, size_t{1026}}) {
    for (int defect = 0; defect < 4; ++defect) {
      Moments bad = m;
      if (defect == 0) bad.mean[c] = NAN;
      if (defect == 1) bad.m2[c] = -INFINITY;
      if (defect == 2) bad.m2[c] = -1e-300;
      if (defect == 3) {  // values without samples
        bad = Moments::Empty(1027);
        bad.mean[c] = 1e-300;
      }
      const absl::Status s = ValidateMoments(bad);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c << " " << defect;
      if (defect < 3) {
        EXPECT_NE(s.message().find(absl::StrCat("channel ", c, " ")),
                  absl::string_view::npos)
            << s.message();
      }
    }
  }
  EXPECT_TRUE(ValidateMoments(Moments::Empty(1027)).ok());
}

TEST(MomentsTest, ValidateRejectsMalformedMoments) {
  Moments m = Moments::Empty(2);
  m.count = 3;
  m.mean = {1, 2};
  m.m2 = {1, 1};
  EXPECT_TRUE(ValidateMoments(m).ok());
  Moments bad = m;
  bad.mean[1] = NAN;
  EXPECT_EQ(ValidateMoments(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = m;
  bad.m2[0] = INFINITY;
  EXPECT_EQ(ValidateMoments(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = m;
  bad.m2[0] = -1;
  EXPECT_EQ(ValidateMoments(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = m;
  bad.count = -2;
  EXPECT_EQ(ValidateMoments(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = m;
  bad.m2.pop_back();
  EXPECT_EQ(ValidateMoments(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = m;
  bad.count = 0;  // values without samples
  EXPECT_EQ(ValidateMoments(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MergeMoments({m, bad}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MergeMoments({m, Moments::Empty(3)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MergeMoments({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MomentsTest, VarianceFlavours) {
  Moments m;
  m.count = 4;
  m.mean = {0.0};
  m.m2 = {6.0};
  EXPECT_DOUBLE_EQ(BiasedVariance(m)[0], 1.5);
  EXPECT_DOUBLE_EQ((*UnbiasedVariance(m))[0], 2.0);
  m.count = 1;
  m.m2 = {0.0};
  EXPECT_EQ(UnbiasedVariance(m).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(MomentsTest, RunningStatsFollowMomentumWithUnbiasedVariance) {
  const Shape shape{10, 4, 3, 3};
  const std::vector<float> x = RandomTensor(shape, 1.0, 2.0, 9, 0.25);
  const reference::Stats want = ComputeStats(x, shape);
  RunningStats stats = RunningStats::Initial(shape.c);
  const double momentum = 0.1;
  ASSERT_TRUE(UpdateRunningStats(MomentsOf(x, shape), momentum, &stats).ok());
  ASSERT_TRUE(UpdateRunningStats(MomentsOf(x, shape), momentum, &stats).ok());
  for (int c = 0; c < shape.c; ++c) {
    const double unbiased = want.m2[c] / (want.count - 1);
    // Two steps from (0, 1): r = (1-m)^2 r0 + (1 - (1-m)^2) batch.
    const double keep = (1 - momentum) * (1 - momentum);
    EXPECT_NEAR(stats.mean[c], (1 - keep) * want.mean[c], 1e-12);
    EXPECT_NEAR(stats.var[c], keep * 1.0 + (1 - keep) * unbiased, 1e-12);
  }
}

TEST(MomentsTest, RunningStatsEdgeCases) {
  RunningStats stats = RunningStats::Initial(2);
  const RunningStats before = stats;
  EXPECT_TRUE(UpdateRunningStats(Moments::Empty(2), 0.1, &stats).ok());
  EXPECT_EQ(stats.mean, before.mean);
  EXPECT_EQ(stats.var, before.var);

  Moments one;
  one.count = 1;
  one.mean = {3, 4};
  one.m2 = {0, 0};
  EXPECT_EQ(UpdateRunningStats(one, 0.1, &stats).code(),
            absl::StatusCode::kFailedPrecondition);
  one.count = 2;
  EXPECT_EQ(UpdateRunningStats(one, 1.5, &stats).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UpdateRunningStats(Moments::Empty(3), 0.1, &stats).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stats.mean, before.mean);
}

TEST(MomentsTest, MixIntoRunningStatsIsUpdateRunningStatsWithoutChecks) {
  Moments batch;
  batch.count = 5;
  batch.mean = {1.5, -2};
  batch.m2 = {4, 0.5};
  RunningStats checked = RunningStats::Initial(2);
  RunningStats mixed = checked;
  ASSERT_TRUE(UpdateRunningStats(batch, 0.25, &checked).ok());
  MixIntoRunningStats(batch, 0.25, &mixed);
  EXPECT_EQ(mixed.mean, checked.mean);  // the same bits
  EXPECT_EQ(mixed.var, checked.var);
  EXPECT_NE(mixed.mean, RunningStats::Initial(2).mean);
}

}  // namespace
}  // namespace bnps::bn
