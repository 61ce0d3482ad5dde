#include "server/bn_aggregator.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <chrono>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "bn/cpu_kernels.h"
#include "bn/reference.h"
#include "gtest/gtest.h"

namespace bnps::server {
namespace {

using Reply = BnAggregator::Reply;
using Result = std::optional<absl::StatusOr<Reply>>;

const absl::Time kNever = absl::InfiniteFuture();

BnAggregator::Done Into(Result* out) {
  return [out](absl::StatusOr<Reply> r) { *out = std::move(r); };
}

bn::Moments MomentsOf(const std::vector<float>& x, const bn::Shape& shape) {
  return *bn::NewCpuBnKernels()->ComputeMoments(x.data(), shape);
}

struct Split {
  bn::Shape whole;
  std::vector<float> x;
  std::vector<bn::Moments> parts;
};

Split MakeSplit(const std::vector<int64_t>& sizes, uint64_t seed) {
  Split s;
  s.whole = {std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), 3, 4, 4};
  s.x = bn::reference::RandomTensor(s.whole, 5.0, 2.0, seed, 0.5);
  int64_t begin = 0;
  for (int64_t n : sizes) {
    bn::Shape part = s.whole;
    part.n = n;
    s.parts.push_back(MomentsOf(
        bn::reference::SliceBatch(s.x, s.whole, begin, begin + n), part));
    begin += n;
  }
  return s;
}

TEST(BnAggregatorTest, SyncForwardIsExactAndArrivalOrderFree) {
  const Split split = MakeSplit({5, 0, 9, 2}, 1);
  const bn::reference::Stats want = bn::reference::ComputeStats(split.x, split.whole);
  std::vector<int> order = {0, 1, 2, 3};
  std::optional<bn::Moments> first;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 6; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    BnAggregator agg({policy::Policy::kSync, 4, 0, 0.1});
    std::vector<Result> results(4);
    for (int k = 0; k < 4; ++k) {
      const int w = order[k];
      agg.Forward(w, 0, "bn1", split.parts[w], kNever, Into(&results[w]));
      for (int j = 0; j <= k; ++j) {
        EXPECT_EQ(results[order[j]].has_value(), k == 3) << "barrier broke early";
      }
    }
    for (const Result& r : results) {
      ASSERT_TRUE(r.has_value() && r->ok());
      EXPECT_EQ((*r)->contributors, 4);
      const bn::Moments& m = (*r)->moments;
      EXPECT_EQ(m.count, want.count);
      for (int c = 0; c < 3; ++c) {
        EXPECT_NEAR(m.mean[c], want.mean[c], 1e-12 * std::fabs(want.mean[c]));
        EXPECT_NEAR(m.m2[c], want.m2[c], 1e-9 * want.m2[c]);
      }
      if (!first.has_value()) first = m;
      EXPECT_EQ(m.mean, first->mean);  // bitwise, whatever the arrival order
      EXPECT_EQ(m.m2, first->m2);
    }
    // Running stats: updated once, with the unbiased global variance.
    const bn::RunningStats running = *agg.Running("bn1");
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(running.mean[c], 0.1 * want.mean[c], 1e-9);
      EXPECT_NEAR(running.var[c], 0.9 + 0.1 * want.m2[c] / (want.count - 1), 1e-9);
    }
  }
}

TEST(BnAggregatorTest, GroupsNormalizeWithinAndRunningStatsFollowTheJob) {
  // K = 2 of W = 4: workers {0, 1} and {2, 3} each normalize with their
  // group's merge, the running stats are those of sync over all four.
  const std::vector<int64_t> sizes = {5, 3, 9, 2};
  const Split split = MakeSplit(sizes, 11);
  std::vector<bn::reference::Stats> want;  // one process on each group's batch
  for (int g = 0; g < 2; ++g) {
    const int64_t begin = g == 0 ? 0 : sizes[0] + sizes[1];
    const int64_t n = sizes[2 * g] + sizes[2 * g + 1];
    bn::Shape shape = split.whole;
    shape.n = n;
    want.push_back(bn::reference::ComputeStats(
        bn::reference::SliceBatch(split.x, split.whole, begin, begin + n),
        shape));
  }
  BnAggregator whole({policy::Policy::kSync, 4, 0, 0.1});
  std::vector<Result> whole_results(4);
  for (int w = 0; w < 4; ++w) {
    whole.Forward(w, 0, "bn", split.parts[w], kNever, Into(&whole_results[w]));
  }
  const bn::RunningStats job_running = *whole.Running("bn");

  std::vector<int> order = {0, 1, 2, 3};
  std::vector<std::optional<bn::Moments>> first(2);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 6; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    BnAggregator::Options o{policy::Policy::kSync, 4, 0, 0.1};
    o.group_size = 2;
    BnAggregator agg(o);
    std::vector<Result> fwd(4), bwd(4);
    for (int k = 0; k < 4; ++k) {
      const int w = order[k];
      agg.Forward(w, 0, "bn", split.parts[w], kNever, Into(&fwd[w]));
      EXPECT_EQ(fwd[w].has_value(), k == 3) << "the barrier is the job's";
    }
    for (int k = 0; k < 4; ++k) {
      const int w = order[k];
      const double v = w + 1;
      agg.Backward(w, 0, "bn", {{v, 10 * v, 0}, {100 * v, 0, v}}, kNever,
                   Into(&bwd[w]));
    }
    for (int w = 0; w < 4; ++w) {
      const int g = w / 2;
      ASSERT_TRUE(fwd[w].has_value() && fwd[w]->ok());
      EXPECT_EQ((*fwd[w])->contributors, 2);
      EXPECT_EQ((*fwd[w])->group, g);  // for the per-group metrics
      const bn::Moments& m = (*fwd[w])->moments;
      EXPECT_EQ(m.count, want[g].count);
      for (int c = 0; c < 3; ++c) {
        EXPECT_NEAR(m.mean[c], want[g].mean[c], 1e-12 * std::fabs(want[g].mean[c]));
        EXPECT_NEAR(m.m2[c], want[g].m2[c], 1e-9 * want[g].m2[c]);
      }
      if (!first[g].has_value()) first[g] = m;
      EXPECT_EQ(m.mean, first[g]->mean);  // bitwise, whatever the order
      EXPECT_EQ(m.m2, first[g]->m2);
      // The running stats handed back are the job's, bit for bit.
      ASSERT_TRUE((*fwd[w])->running.has_value());
      EXPECT_EQ((*fwd[w])->running->mean, job_running.mean);
      EXPECT_EQ((*fwd[w])->running->var, job_running.var);
      ASSERT_TRUE(bwd[w].has_value() && bwd[w]->ok());
      const double a = 2 * g + 1, b = 2 * g + 2;  // the group's two workers
      EXPECT_EQ((*bwd[w])->sums.sum_dy,
                (std::vector<double>{a + b, 10 * (a + b), 0}));
      EXPECT_EQ((*bwd[w])->sums.sum_dy_xhat,
                (std::vector<double>{100 * (a + b), 0, a + b}));
    }
    EXPECT_EQ(agg.Running("bn")->mean, job_running.mean);
    EXPECT_EQ(agg.Running("bn")->var, job_running.var);
    // A retry gets its own group's answer.
    Result again;
    agg.Forward(3, 0, "bn", split.parts[3], kNever, Into(&again));
    ASSERT_TRUE(again.has_value() && again->ok());
    EXPECT_EQ((*again)->moments.mean, first[1]->mean);
  }
}

TEST(BnAggregatorTest, RetryGetsTheSameAnswerAndIsNotMergedTwice) {
  const Split split = MakeSplit({3, 4}, 2);
  BnAggregator agg({policy::Policy::kSync, 2, 0, 0.1});
  Result a, b, again;
  agg.Forward(0, 0, "bn", split.parts[0], kNever, Into(&a));
  agg.Forward(0, 0, "bn", split.parts[1], kNever, Into(&again));  // a retry
  EXPECT_FALSE(a.has_value());
  agg.Forward(1, 0, "bn", split.parts[1], kNever, Into(&b));
  ASSERT_TRUE(a.has_value() && a->ok() && again.has_value() && again->ok());
  EXPECT_EQ((*a)->moments.count, 7 * 16);  // the retry's different value was ignored
  EXPECT_EQ((*again)->moments.mean, (*a)->moments.mean);
  const bn::RunningStats before = *agg.Running("bn");
  Result late;
  agg.Forward(1, 0, "bn", split.parts[1], kNever, Into(&late));
  ASSERT_TRUE(late.has_value() && late->ok());
  EXPECT_EQ((*late)->moments.mean, (*a)->moments.mean);
  EXPECT_EQ(agg.Running("bn")->mean, before.mean);  // not updated again
}

TEST(BnAggregatorTest, SyncBackwardSumsInWorkerOrder) {
  BnAggregator agg({policy::Policy::kSync, 3, 0, 0.1});
  Result r0, r1, r2;
  agg.Backward(2, 0, "bn", {{1, 2}, {3, 4}}, kNever, Into(&r2));
  agg.Backward(0, 0, "bn", {{10, 20}, {30, 40}}, kNever, Into(&r0));
  EXPECT_FALSE(r0.has_value());
  agg.Backward(1, 0, "bn", {{100, 200}, {300, 400}}, kNever, Into(&r1));
  for (const Result* r : {&r0, &r1, &r2}) {
    ASSERT_TRUE(r->has_value() && (*r)->ok());
    EXPECT_EQ((**r)->sums.sum_dy, (std::vector<double>{111, 222}));
    EXPECT_EQ((**r)->sums.sum_dy_xhat, (std::vector<double>{333, 444}));
  }
}

TEST(BnAggregatorTest, MissingWorkerTimesOutAndIsNamed) {
  const Split split = MakeSplit({2, 2, 2}, 3);
  BnAggregator agg({policy::Policy::kSync, 3, 0, 0.1});
  const absl::Time t0 = absl::FromUnixSeconds(100);
  Result r0, r2, late;
  agg.Forward(0, 0, "bn", split.parts[0], t0 + absl::Seconds(2), Into(&r0));
  agg.Forward(2, 0, "bn", split.parts[2], t0 + absl::Seconds(3), Into(&r2));
  agg.ExpireDeadlines(t0 + absl::Seconds(1));
  EXPECT_FALSE(r0.has_value());
  agg.ExpireDeadlines(t0 + absl::Seconds(2));  // the earliest deadline counts
  ASSERT_TRUE(r0.has_value() && r2.has_value());
  EXPECT_EQ(r0->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r0->status().message().find("workers [1]"), std::string::npos)
      << r0->status();
  EXPECT_EQ(r2->status(), r0->status());
  agg.Forward(1, 0, "bn", split.parts[1], kNever, Into(&late));
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(BnAggregatorTest, ShrinkAndFail) {
  const Split split = MakeSplit({2, 3, 4}, 4);
  {
    BnAggregator agg({policy::Policy::kSync, 3, 0, 0.1});
    Result r0, r1;
    agg.Forward(0, 0, "bn", split.parts[0], kNever, Into(&r0));
    agg.Forward(1, 0, "bn", split.parts[1], kNever, Into(&r1));
    agg.RemoveWorker(2);
    ASSERT_TRUE(r0.has_value() && r0->ok());
    EXPECT_EQ((*r0)->moments.count, (2 + 3) * 16);
    EXPECT_EQ((*r0)->contributors, 2);
    Result removed;
    agg.Forward(2, 1, "bn", split.parts[2], kNever, Into(&removed));
    EXPECT_EQ(removed->status().code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    BnAggregator agg({policy::Policy::kSync, 3, 0, 0.1});
    Result r0;
    agg.Forward(0, 0, "bn", split.parts[0], kNever, Into(&r0));
    agg.FailWorker(1, absl::UnavailableError("no heartbeat from worker 1"));
    ASSERT_TRUE(r0.has_value());
    EXPECT_EQ(r0->status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(r0->status().message().find("worker 1"), std::string::npos);
  }
}

TEST(BnAggregatorTest, AsyncNeverWaitsAndRespectsTheWindow) {
  const Split split = MakeSplit({2, 3, 4}, 5);
  BnAggregator agg({policy::Policy::kAsync, 3, /*staleness=*/1, 0.1});
  Result r;
  for (int step = 0; step < 2; ++step) {  // worker 0 at steps 0 and 1
    agg.Forward(0, step, "bn", split.parts[0], kNever, Into(&r));
    ASSERT_TRUE(r.has_value() && r->ok()) << "async must answer at once";
  }
  agg.Forward(1, 3, "bn", split.parts[1], kNever, Into(&r));  // worker 1 at step 3
  ASSERT_TRUE(r.has_value() && r->ok()) << "async must answer at once";
  EXPECT_EQ((*r)->moments.count, 0);  // worker 0's step 1 < 3 - 1: too stale
  agg.Forward(2, 5, "bn", split.parts[2], kNever, Into(&r));
  ASSERT_TRUE(r.has_value() && r->ok());
  EXPECT_EQ((*r)->contributors, 0);  // step 3 < 5 - 1: too stale
  agg.Forward(0, 4, "bn", split.parts[0], kNever, Into(&r));
  ASSERT_TRUE(r.has_value() && r->ok());
  EXPECT_EQ((*r)->contributors, 2);  // 3 >= 4 - 1 and 5 >= 4 - 1
  const bn::Moments want = *bn::MergeMoments({split.parts[1], split.parts[2]});
  EXPECT_EQ((*r)->moments.count, want.count);
  EXPECT_EQ((*r)->moments.mean, want.mean);
  Result past;
  agg.Forward(0, 2, "bn", split.parts[0], kNever, Into(&past));
  EXPECT_EQ(past->status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BnAggregatorTest, AsyncWithOneWorkerIsLocal) {
  const Split split = MakeSplit({6}, 6);
  BnAggregator agg({policy::Policy::kAsync, 1, 2, 0.1});
  for (int step = 0; step < 3; ++step) {
    Result r;
    agg.Forward(0, step, "bn", split.parts[0], kNever, Into(&r));
    ASSERT_TRUE(r.has_value() && r->ok());
    EXPECT_EQ((*r)->moments.count, 0);
    EXPECT_EQ((*r)->contributors, 0);
  }
}

// A worker's recalibration moments are bounded (they are kept until the
// job ends): past its bytes a Recal is RESOURCE_EXHAUSTED, the other worker
// still files its own, a retry of a filed batch stays accepted, and the
// finish merges what was filed.
TEST(BnAggregatorTest, RecalMomentsOfAWorkerAreBounded) {
  BnAggregator::Options o{policy::Policy::kSync, 2, 0, 0.1};
  const int64_t per_batch = 2 * 8 * 3 + 96;  // 3 channels
  o.recal_bytes_per_worker = 4 * per_batch;
  BnAggregator agg(o);
  const bn::Shape batch{2, 3, 2, 2};
  const std::vector<float> x = bn::reference::RandomTensor(batch, 7, 1.0, 1, 2.0);
  auto recal = [&](int w, int64_t b) {
    Result r;
    agg.Recal(w, b, "bn", MomentsOf(x, batch), Into(&r));
    return r->status();
  };
  for (int64_t b = 0; b < 4; ++b) ASSERT_TRUE(recal(0, b).ok()) << b;
  const absl::Status refused = recal(0, 4);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("worker 0"), std::string::npos) << refused;
  EXPECT_TRUE(recal(0, 3).ok());  // a retry: already filed
  EXPECT_TRUE(recal(1, 0).ok());  // the other worker's room is its own
  Result f0, f1;
  agg.RecalFinish(0, "bn", kNever, Into(&f0));
  agg.RecalFinish(1, "bn", kNever, Into(&f1));
  ASSERT_TRUE(f0.has_value() && f0->ok()) << f0->status();
  EXPECT_EQ((*f0)->moments.count, 5 * 2 * 2 * 2);  // five batches of N*H*W
  // Merged, a layer's batches give their room back: worker 0 files four of
  // another layer, and a fifth is refused again.
  auto recal_other = [&](int64_t b) {
    Result r;
    agg.Recal(0, b, "bn2", MomentsOf(x, batch), Into(&r));
    return r->status();
  };
  for (int64_t b = 0; b < 4; ++b) ASSERT_TRUE(recal_other(b).ok()) << b;
  EXPECT_EQ(recal_other(4).code(), absl::StatusCode::kResourceExhausted);
  // The finished layer refuses more, and a retried finish gets its answer.
  EXPECT_EQ(recal(0, 9).code(), absl::StatusCode::kFailedPrecondition);
  Result again;
  agg.RecalFinish(0, "bn", kNever, Into(&again));
  ASSERT_TRUE(again.has_value() && again->ok()) << again->status();
  EXPECT_EQ((*again)->moments.count, 5 * 2 * 2 * 2);
}

TEST(BnAggregatorTest, RecalEqualsOneProcessOverTheUnion) {
  // Two workers, several batches each, of a shifted distribution.
  const bn::Shape batch{4, 3, 5, 5};
  std::vector<float> all;
  BnAggregator agg({policy::Policy::kRecal, 2, 0, 0.1});
  int batches = 0;
  for (int w = 0; w < 2; ++w) {
    for (int b = 0; b < 3 + w; ++b) {
      const std::vector<float> x =
          bn::reference::RandomTensor(batch, 1e3 + b, 1.0 + w, 100 * w + b, 2.0);
      all.insert(all.end(), x.begin(), x.end());
      Result r;
      agg.Recal(w, b, "bn", MomentsOf(x, batch), Into(&r));
      ASSERT_TRUE(r.has_value() && r->ok());
      agg.Recal(w, b, "bn", MomentsOf(x, batch), Into(&r));  // retried: ignored
      ++batches;
    }
  }
  Result f0, f1;
  agg.RecalFinish(1, "bn", kNever, Into(&f1));
  EXPECT_FALSE(f1.has_value());
  agg.RecalFinish(0, "bn", kNever, Into(&f0));
  ASSERT_TRUE(f0.has_value() && f0->ok()) << f0->status();
  const bn::Shape union_shape{batch.n * batches, 3, 5, 5};
  const bn::reference::Stats want = bn::reference::ComputeStats(all, union_shape);
  const bn::RunningStats& got = *(*f0)->running;
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(got.mean[c], want.mean[c], 1e-6 * std::fabs(want.mean[c]));
    const double unbiased = want.m2[c] / (want.count - 1);
    EXPECT_NEAR(got.var[c], unbiased, 1e-6 * unbiased);
  }
  EXPECT_EQ(agg.Running("bn")->mean, got.mean);
  Result after;
  agg.Recal(0, 9, "bn", MomentsOf(all, batch), Into(&after));
  EXPECT_EQ(after->status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BnAggregatorTest, LocalAveragesRunningStats) {
  BnAggregator agg({policy::Policy::kLocal, 2, 0, 0.1});
  Result r0, r1;
  agg.LocalRunning(0, "bn", {{1, 2}, {3, 4}}, kNever, Into(&r0));
  agg.LocalRunning(1, "bn", {{3, 4}, {5, 8}}, kNever, Into(&r1));
  ASSERT_TRUE(r0.has_value() && r0->ok());
  EXPECT_EQ((*r0)->running->mean, (std::vector<double>{2, 3}));
  EXPECT_EQ((*r0)->running->var, (std::vector<double>{4, 6}));
}

TEST(BnAggregatorTest, RejectsWhatThePolicyDoesNotUse) {
  const Split split = MakeSplit({2, 2}, 8);
  Result r;
  BnAggregator local({policy::Policy::kLocal, 2, 0, 0.1});
  local.Forward(0, 0, "bn", split.parts[0], kNever, Into(&r));
  EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition);
  BnAggregator async({policy::Policy::kAsync, 2, 1, 0.1});
  async.Backward(0, 0, "bn", {{1}, {1}}, kNever, Into(&r));
  EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition);
  BnAggregator sync({policy::Policy::kSync, 2, 0, 0.1});
  sync.LocalRunning(0, "bn", {{1}, {1}}, kNever, Into(&r));
  EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition);
  sync.Forward(5, 0, "bn", split.parts[0], kNever, Into(&r));
  EXPECT_EQ(r->status().code(), absl::StatusCode::kInvalidArgument);
  sync.Forward(0, 0, "bn", split.parts[0], kNever, Into(&r));
  sync.Forward(1, 0, "bn", bn::Moments::Empty(7), kNever, Into(&r));
  EXPECT_EQ(r->status().code(), absl::StatusCode::kInvalidArgument);  // channels
}

TEST(BnAggregatorTest, StepFromThePast) {
  const Split split = MakeSplit({2}, 9);
  BnAggregator agg({policy::Policy::kSync, 1, 0, 0.1});
  Result r;
  for (int step = 0; step < 40; ++step) {
    agg.Forward(0, step, "bn", split.parts[0], kNever, Into(&r));
    ASSERT_TRUE(r->ok());
  }
  agg.Forward(0, 39, "bn", split.parts[0], kNever, Into(&r));
  EXPECT_TRUE(r->ok());  // recent: a retry, answered from the cache
  agg.Forward(0, 3, "bn", split.parts[0], kNever, Into(&r));
  EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition);
}

constexpr int64_t kFarFuture = 1'000'000'000'000'000;  // 10^15

// A BN step no clock allows is refused and changes nothing (not even the
// layer's channel count); the real steps afterwards work.
TEST(BnAggregatorTest, SyncRefusesStepsBeyondTheNext) {
  const Split split = MakeSplit({4}, 10);
  int64_t version = 0;
  BnAggregator::Options o{policy::Policy::kSync, 1, 0, 0.1};
  o.parameter_version = [&version] { return version; };
  BnAggregator agg(o);
  Result r;
  agg.Forward(0, kFarFuture, "bn", bn::Moments::Empty(7), kNever, Into(&r));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r->status().message().find("future"), std::string::npos);
  agg.Backward(0, kFarFuture, "bn", {{1}, {1}}, kNever, Into(&r));
  EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition);
  agg.Forward(0, 1, "bn", split.parts[0], kNever, Into(&r));  // expects 0
  EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(agg.num_layers(), 0);
  for (int64_t step = 0; step < 3; ++step) {
    agg.Forward(0, step, "bn", split.parts[0], kNever, Into(&r));
    ASSERT_TRUE(r->ok()) << step << ": " << r->status();
    agg.Backward(0, step, "bn", bn::BackwardSums::Zero(3), kNever, Into(&r));
    ASSERT_TRUE(r->ok()) << step << ": " << r->status();
  }
  agg.Forward(0, 4, "bn", split.parts[0], kNever, Into(&r));
  EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition);
  // The parameters' version says how far the job got.
  version = 9;
  agg.Forward(0, 9, "bn", split.parts[0], kNever, Into(&r));
  EXPECT_TRUE(r->ok()) << r->status();
}

TEST(BnAggregatorTest, AsyncRefusesStepsBeyondTheBound) {
  const Split split = MakeSplit({4, 4}, 11);
  BnAggregator agg({policy::Policy::kAsync, 2, /*staleness=*/2, 0.1});
  Result r;
  for (int64_t step : {kFarFuture, int64_t{3}}) {  // nothing yet: up to 2
    agg.Forward(0, step, "bn", split.parts[0], kNever, Into(&r));
    EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition) << step;
  }
  EXPECT_EQ(agg.num_layers(), 0);
  agg.Forward(0, 0, "bn", split.parts[0], kNever, Into(&r));
  ASSERT_TRUE(r->ok()) << r->status();
  agg.Forward(1, 3, "bn", split.parts[1], kNever, Into(&r));  // 0 + 1 + 2
  ASSERT_TRUE(r->ok()) << r->status();
  EXPECT_EQ((*r)->contributors, 0);  // worker 0's step 0 < 3 - 2
  agg.Forward(0, 1, "bn", split.parts[0], kNever, Into(&r));  // not "past"
  ASSERT_TRUE(r->ok()) << r->status();
  EXPECT_EQ((*r)->contributors, 1);
  agg.Forward(1, 7, "bn", split.parts[1], kNever, Into(&r));  // 3 + 1 + 2 = 6
  EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition);
}

// Groups by host (Options::group_by_host): a barrier that completes before
// SetGroups fails rather than answer with unknown groups; after it, groups
// of any sizes ({0, 1, 2} and {3} here) get their merges, in worker order.
TEST(BnAggregatorTest, GroupsByHostFollowSetGroups) {
  const Split split = MakeSplit({4, 1, 6, 3}, 31);
  BnAggregator::Options o{policy::Policy::kSync, 4, 0, 0.1};
  o.group_by_host = true;
  BnAggregator agg(o);
  std::vector<Result> early(4);
  for (int w = 0; w < 4; ++w) {
    agg.Forward(w, 0, "bn", split.parts[w], kNever, Into(&early[w]));
  }
  for (const Result& r : early) {
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(r->status().message().find("--bn_group=host"), std::string::npos);
  }
  agg.SetGroups({0, 0, 0, 1});
  std::vector<Result> fwd(4);
  for (int w : {2, 3, 0, 1}) {
    agg.Forward(w, 1, "bn", split.parts[w], kNever, Into(&fwd[w]));
  }
  const bn::Moments big = bn::MergeInOrder(
      {&split.parts[0], &split.parts[1], &split.parts[2]}, 3);
  for (int w = 0; w < 4; ++w) {
    ASSERT_TRUE(fwd[w].has_value() && fwd[w]->ok()) << w;
    const bn::Moments& want = w < 3 ? big : split.parts[3];
    EXPECT_EQ((*fwd[w])->contributors, w < 3 ? 3 : 1);
    EXPECT_EQ((*fwd[w])->group, w < 3 ? 0 : 1);
    EXPECT_EQ((*fwd[w])->moments.mean, want.mean) << w;
    EXPECT_EQ((*fwd[w])->moments.m2, want.m2) << w;
  }
}

// --bn_staleness=2 (exact) with workers at different, changing speeds: at
// every step t >= 2 each worker gets exactly the other members of its BN
// group's moments of step t - 2 (every worker's without groups), merged in
// worker order (bit for bit), and before step 2 nothing but its own;
// whoever runs ahead waits. The running stats of group_size K's run follow
// the job: the last step's equal those of the same run without groups.
std::vector<std::vector<Reply>> RunExactStaleness(int workers, int group_size) {
  constexpr int kSteps = 10;
  constexpr int64_t kS = 2;
  auto moments = [](int w, int64_t t) {
    return MakeSplit({2 + w}, 100 * w + t).parts[0];
  };
  BnAggregator::Options o{policy::Policy::kAsync, workers,
                          /*staleness=*/kSteps, 0.1};
  o.bn_staleness = kS;
  o.group_size = group_size;
  BnAggregator agg(o);
  std::vector<std::vector<Reply>> got(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(w + 1);
      for (int64_t t = 0; t < kSteps; ++t) {
        // Worker 0 fast, the last slow, with jitter.
        std::this_thread::sleep_for(
            std::chrono::milliseconds(w * 4 + rng() % 4));
        std::promise<absl::StatusOr<Reply>> p;
        agg.Forward(w, t, "bn", moments(w, t),
                    absl::Now() + absl::Seconds(30),
                    [&p](absl::StatusOr<Reply> r) { p.set_value(r); });
        absl::StatusOr<Reply> r = p.get_future().get();
        ASSERT_TRUE(r.ok()) << r.status();
        got[w].push_back(*r);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const int k = group_size == 0 ? workers : group_size;
  for (int w = 0; w < workers; ++w) {
    EXPECT_EQ(got[w].size(), static_cast<size_t>(kSteps));
    for (int64_t t = 0; t < static_cast<int64_t>(got[w].size()); ++t) {
      const Reply& r = got[w][t];
      if (t < kS) {
        EXPECT_EQ(r.contributors, 0) << w << " " << t;
        continue;
      }
      std::vector<bn::Moments> others;
      for (int o2 = w / k * k; o2 < (w / k + 1) * k; ++o2) {
        if (o2 != w) others.push_back(moments(o2, t - kS));
      }
      std::vector<const bn::Moments*> parts;
      for (const bn::Moments& m : others) parts.push_back(&m);
      const bn::Moments want = bn::MergeInOrder(parts, 3);
      EXPECT_EQ(r.contributors, k - 1) << w << " " << t;
      EXPECT_EQ(r.moments.count, want.count) << w << " " << t;
      EXPECT_EQ(r.moments.mean, want.mean) << w << " " << t;
      EXPECT_EQ(r.moments.m2, want.m2) << w << " " << t;
      EXPECT_TRUE(r.running.has_value());
    }
  }
  return got;
}

TEST(BnAggregatorTest, ExactStalenessGivesStepTMinusSWhateverTheSpeeds) {
  RunExactStaleness(/*workers=*/3, /*group_size=*/0);
}

TEST(BnAggregatorTest, ExactStalenessWithinGroupsGivesTheGroupsStepTMinusS) {
  RunExactStaleness(/*workers=*/4, /*group_size=*/2);
}

// Async BN (bounded) with groups of 2 of 4: an answer merges the admissible
// moments of the asker's group only, while the running stats are bit for
// bit those of the same arrivals without groups.
TEST(BnAggregatorTest, AsyncGroupsAnswerWithinAndRunningStatsFollowTheJob) {
  const Split split = MakeSplit({3, 5, 2, 7}, 21);
  BnAggregator::Options o{policy::Policy::kAsync, 4, /*staleness=*/1, 0.1};
  BnAggregator whole(o);
  o.group_size = 2;
  BnAggregator grouped(o);
  // (worker, step) in arrival order; worker 3 lags two steps behind.
  const std::vector<std::pair<int, int64_t>> arrivals = {
      {0, 0}, {3, 0}, {1, 0}, {2, 0}, {0, 1}, {2, 1}, {1, 1}, {0, 2}, {1, 2}};
  std::vector<std::pair<int, int64_t>> seen(4, {-1, -1});  // newest by worker
  for (const auto& [w, t] : arrivals) {
    Result g, a;
    grouped.Forward(w, t, "bn", split.parts[w], kNever, Into(&g));
    whole.Forward(w, t, "bn", split.parts[w], kNever, Into(&a));
    ASSERT_TRUE(g.has_value() && g->ok()) << w << " " << t;
    ASSERT_TRUE(a.has_value() && a->ok());
    seen[w] = {w, t};
    // Want: the group's other members whose newest step is >= t - 1.
    std::vector<const bn::Moments*> parts;
    for (int o2 = w / 2 * 2; o2 < w / 2 * 2 + 2; ++o2) {
      if (o2 != w && seen[o2].second >= 0 && seen[o2].second >= t - 1) {
        parts.push_back(&split.parts[o2]);
      }
    }
    const bn::Moments want = bn::MergeInOrder(parts, 3);
    EXPECT_EQ((*g)->contributors, static_cast<int>(parts.size())) << w << t;
    EXPECT_EQ((*g)->moments.count, want.count) << w << " " << t;
    EXPECT_EQ((*g)->moments.mean, want.mean) << w << " " << t;
    EXPECT_EQ((*g)->moments.m2, want.m2) << w << " " << t;
    ASSERT_TRUE((*g)->running.has_value() && (*a)->running.has_value());
    EXPECT_EQ((*g)->running->mean, (*a)->running->mean) << w << " " << t;
    EXPECT_EQ((*g)->running->var, (*a)->running->var) << w << " " << t;
  }
  // Worker 3's step 0 is too stale for worker 2's step 2 within the group.
  Result last;
  grouped.Forward(2, 2, "bn", split.parts[2], kNever, Into(&last));
  ASSERT_TRUE(last.has_value() && last->ok());
  EXPECT_EQ((*last)->contributors, 0);
}

}  // namespace
}  // namespace bnps::server
