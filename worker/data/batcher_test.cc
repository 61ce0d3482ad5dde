#include "worker/data/batcher.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "worker/data/synthetic.h"

namespace bnps::worker {
namespace {

Dataset Small(int64_t n) {
  return MakeSyntheticDataset(n, /*rows=*/4, /*cols=*/3, /*num_classes=*/10,
                              /*seed=*/7);
}

Batcher MustCreate(const Dataset* d, const BatcherOptions& options) {
  absl::StatusOr<Batcher> b = Batcher::Create(d, options);
  EXPECT_TRUE(b.ok()) << b.status();
  return *std::move(b);
}

// All batches of one epoch.
std::vector<Batch> Epoch(Batcher* b, int64_t epoch) {
  b->StartEpoch(epoch);
  std::vector<Batch> batches;
  Batch batch;
  while (b->Next(&batch)) batches.push_back(batch);
  return batches;
}

std::vector<int64_t> Indices(const std::vector<Batch>& batches) {
  std::vector<int64_t> out;
  for (const Batch& b : batches) {
    out.insert(out.end(), b.indices.begin(), b.indices.end());
  }
  return out;
}

std::vector<int64_t> Sizes(const std::vector<Batch>& batches) {
  std::vector<int64_t> out;
  for (const Batch& b : batches) out.push_back(b.n);
  return out;
}

class ShardingTest
    : public testing::TestWithParam<std::tuple<int, int64_t, bool>> {};

TEST_P(ShardingTest, EveryExampleOncePerEpochAcrossWorkers) {
  const auto [workers, n, shuffle] = GetParam();
  const Dataset d = Small(n);
  BatcherOptions options;
  options.num_workers = workers;
  options.batch_size = 8;
  options.shuffle = shuffle;
  options.seed = 42;
  const int64_t steps = StepsPerEpoch(options, n);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const std::vector<int64_t> perm =
        EpochPermutation(n, options.seed, epoch, shuffle);
    std::map<int64_t, int> seen;
    int64_t total = 0;
    for (int w = 0; w < workers; ++w) {
      options.worker = w;
      Batcher b = MustCreate(&d, options);
      EXPECT_EQ(b.batches_per_epoch(), steps);
      const std::vector<Batch> batches = Epoch(&b, epoch);
      EXPECT_EQ(static_cast<int64_t>(batches.size()), steps);
      const std::vector<int64_t> got = Indices(batches);
      EXPECT_EQ(static_cast<int64_t>(got.size()), b.examples_per_epoch());
      // The shard is the contiguous slice [w*n/W, (w+1)*n/W) of the
      // permutation.
      const std::vector<int64_t> want(perm.begin() + w * n / workers,
                                      perm.begin() + (w + 1) * n / workers);
      EXPECT_EQ(got, want) << "worker " << w << " epoch " << epoch;
      for (int64_t i : got) ++seen[i];
      total += static_cast<int64_t>(got.size());
      for (const Batch& batch : batches) {
        for (int64_t i = 0; i < batch.n; ++i) {
          EXPECT_EQ(batch.labels[i], d.labels[batch.indices[i]]);
        }
      }
    }
    EXPECT_EQ(total, n);
    ASSERT_EQ(static_cast<int64_t>(seen.size()), n);
    for (const auto& [index, times] : seen) {
      EXPECT_EQ(times, 1) << index;
      EXPECT_GE(index, 0);
      EXPECT_LT(index, n);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorkersSizesShuffle, ShardingTest,
                         testing::Combine(testing::Values(1, 3, 4),
                                          testing::Values(10, 103),
                                          testing::Bool()));

TEST(EpochPermutationTest, IsAPermutationAndIdentityWithoutShuffle) {
  for (int64_t n : {0, 1, 2, 17, 1000}) {
    std::vector<int64_t> p = EpochPermutation(n, 3, 5, true);
    std::set<int64_t> s(p.begin(), p.end());
    EXPECT_EQ(static_cast<int64_t>(s.size()), n);
    if (n > 0) {
      EXPECT_EQ(*s.rbegin(), n - 1);
    }
    std::vector<int64_t> id = EpochPermutation(n, 3, 5, false);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(id[i], i);
  }
}

// The generator is written out in batcher.cc so that every platform and
// standard library shuffles alike; this pins its output.
TEST(EpochPermutationTest, Golden) {
  EXPECT_EQ(EpochPermutation(10, 1, 0, true),
            (std::vector<int64_t>{1, 9, 6, 5, 7, 4, 3, 2, 8, 0}));
  EXPECT_EQ(EpochPermutation(10, 1, 1, true),
            (std::vector<int64_t>{8, 0, 6, 1, 9, 5, 2, 4, 3, 7}));
}

TEST(BatcherTest, DeterministicAcrossInstancesDifferentAcrossEpochs) {
  const Dataset d = Small(1000);
  BatcherOptions options;
  options.num_workers = 3;
  options.worker = 1;
  options.batch_size = 50;
  options.seed = 9;
  Batcher a = MustCreate(&d, options);
  Batcher b = MustCreate(&d, options);
  const std::vector<int64_t> a0 = Indices(Epoch(&a, 0));
  const std::vector<int64_t> a1 = Indices(Epoch(&a, 1));
  // b visits the epochs in another order.
  const std::vector<int64_t> b1 = Indices(Epoch(&b, 1));
  const std::vector<int64_t> b0 = Indices(Epoch(&b, 0));
  EXPECT_EQ(a0, b0);
  EXPECT_EQ(a1, b1);
  EXPECT_NE(a0, a1);
  EXPECT_NE(std::set<int64_t>(a0.begin(), a0.end()),
            std::set<int64_t>(a1.begin(), a1.end()));

  // The images follow the indices.
  a.StartEpoch(4);
  b.StartEpoch(4);
  Batch x, y;
  while (a.Next(&x)) {
    ASSERT_TRUE(b.Next(&y));
    EXPECT_EQ(x.images, y.images);
    EXPECT_EQ(x.labels, y.labels);
  }
  EXPECT_FALSE(b.Next(&y));

  // Another seed, another order.
  options.seed = 10;
  Batcher c = MustCreate(&d, options);
  EXPECT_NE(Indices(Epoch(&c, 0)), a0);
}

TEST(BatcherTest, CreateStartsAtEpochZero) {
  const Dataset d = Small(50);
  BatcherOptions options;
  options.batch_size = 7;
  Batcher a = MustCreate(&d, options);
  EXPECT_EQ(a.epoch(), 0);
  std::vector<Batch> batches;
  Batch batch;
  while (a.Next(&batch)) batches.push_back(batch);
  EXPECT_EQ(a.step(), a.batches_per_epoch());
  Batcher b = MustCreate(&d, options);
  EXPECT_EQ(Indices(batches), Indices(Epoch(&b, 0)));
  // Past the end, Next stays false and leaves the batch alone.
  batch.n = 123;
  EXPECT_FALSE(a.Next(&batch));
  EXPECT_EQ(batch.n, 123);
}

TEST(BatcherTest, BatchSizesAndDropLast) {
  const Dataset d = Small(10);
  BatcherOptions options;
  options.batch_size = 4;
  Batcher b = MustCreate(&d, options);
  EXPECT_EQ(Sizes(Epoch(&b, 0)), (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(b.batches_per_epoch(), 3);
  EXPECT_EQ(b.examples_per_epoch(), 10);

  options.drop_last = true;
  Batcher dropping = MustCreate(&d, options);
  EXPECT_EQ(Sizes(Epoch(&dropping, 0)), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(dropping.batches_per_epoch(), 2);
  EXPECT_EQ(dropping.examples_per_epoch(), 8);

  options.batch_size = 5;  // divides evenly: nothing to drop
  Batcher even = MustCreate(&d, options);
  EXPECT_EQ(Sizes(Epoch(&even, 0)), (std::vector<int64_t>{5, 5}));

  options.drop_last = false;
  options.batch_size = 64;  // one batch bigger than the dataset
  Batcher big = MustCreate(&d, options);
  EXPECT_EQ(Sizes(Epoch(&big, 0)), (std::vector<int64_t>{10}));
}

// Sizes of every worker's batches in epoch 0.
std::vector<std::vector<int64_t>> AllSizes(const Dataset& d,
                                           BatcherOptions options) {
  std::vector<std::vector<int64_t>> out;
  for (int w = 0; w < options.num_workers; ++w) {
    options.worker = w;
    Batcher b = MustCreate(&d, options);
    out.push_back(Sizes(Epoch(&b, 0)));
    EXPECT_EQ(static_cast<int64_t>(out.back().size()),
              StepsPerEpoch(options, d.size()));
  }
  return out;
}

TEST(BatcherTest, StepsPerEpochFollowsTheLargestShard) {
  const Dataset d = Small(10);  // 3 workers: shards of 3, 3 and 4
  BatcherOptions options;
  options.num_workers = 3;

  options.batch_size = 2;
  EXPECT_EQ(StepsPerEpoch(options, 10), 2);
  EXPECT_EQ(AllSizes(d, options),
            (std::vector<std::vector<int64_t>>{{2, 1}, {2, 1}, {2, 2}}));

  options.batch_size = 3;  // workers 0 and 1 run out a step early
  EXPECT_EQ(StepsPerEpoch(options, 10), 2);
  EXPECT_EQ(AllSizes(d, options),
            (std::vector<std::vector<int64_t>>{{3, 0}, {3, 0}, {3, 1}}));

  options.drop_last = true;
  EXPECT_EQ(StepsPerEpoch(options, 10), 1);
  EXPECT_EQ(AllSizes(d, options),
            (std::vector<std::vector<int64_t>>{{3}, {3}, {3}}));

  options.batch_size = 2;  // short batches become empty ones
  EXPECT_EQ(StepsPerEpoch(options, 10), 2);
  EXPECT_EQ(AllSizes(d, options),
            (std::vector<std::vector<int64_t>>{{2, 0}, {2, 0}, {2, 2}}));

  options.batch_size = 5;  // no shard has a full batch
  EXPECT_EQ(StepsPerEpoch(options, 10), 0);
  EXPECT_EQ(AllSizes(d, options),
            (std::vector<std::vector<int64_t>>{{}, {}, {}}));
}

TEST(BatcherTest, MoreWorkersThanExamples) {
  const Dataset d = Small(2);
  BatcherOptions options;
  options.num_workers = 4;  // shards of 0, 1, 0, 1
  options.batch_size = 3;
  EXPECT_EQ(StepsPerEpoch(options, 2), 1);
  EXPECT_EQ(AllSizes(d, options),
            (std::vector<std::vector<int64_t>>{{0}, {1}, {0}, {1}}));
  options.worker = 0;
  Batcher b = MustCreate(&d, options);
  Batch batch;
  batch.images.assign(5, 1.0f);
  batch.labels.assign(5, 1);
  batch.indices.assign(5, 1);
  ASSERT_TRUE(b.Next(&batch));
  EXPECT_EQ(batch.n, 0);
  EXPECT_EQ(batch.height, 4);
  EXPECT_EQ(batch.width, 3);
  EXPECT_TRUE(batch.images.empty());
  EXPECT_TRUE(batch.labels.empty());
  EXPECT_TRUE(batch.indices.empty());
  EXPECT_FALSE(b.Next(&batch));
}

TEST(BatcherTest, StepsPerEpochArithmetic) {
  BatcherOptions options;
  options.num_workers = 4;
  options.batch_size = 32;
  EXPECT_EQ(StepsPerEpoch(options, 60000), 469);  // ceil(15000 / 32)
  options.drop_last = true;
  EXPECT_EQ(StepsPerEpoch(options, 60000), 468);
  options.drop_last = false;
  options.num_workers = 7;  // largest shard ceil(60000 / 7) = 8572
  EXPECT_EQ(StepsPerEpoch(options, 60000), 268);
  options.limit = 1000;  // largest shard 143
  EXPECT_EQ(StepsPerEpoch(options, 60000), 5);
  options.limit = 100000;  // more than there is: all of it
  EXPECT_EQ(StepsPerEpoch(options, 60000), 268);
  EXPECT_EQ(StepsPerEpoch(options, 0), 0);
  options.batch_size = 0;
  EXPECT_EQ(StepsPerEpoch(options, 60000), 0);
}

TEST(BatcherTest, Limit) {
  const Dataset d = Small(103);
  BatcherOptions options;
  options.num_workers = 2;
  options.limit = 50;
  std::set<int64_t> seen;
  for (int w = 0; w < 2; ++w) {
    options.worker = w;
    Batcher b = MustCreate(&d, options);
    EXPECT_EQ(b.examples_per_epoch(), 25);
    for (int64_t i : Indices(Epoch(&b, 3))) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 50u);
  EXPECT_EQ(*seen.rbegin(), 49);

  options.limit = 1000;
  options.worker = 1;
  Batcher b = MustCreate(&d, options);
  EXPECT_EQ(b.shard_begin(), 51);
  EXPECT_EQ(b.shard_end(), 103);
}

TEST(BatcherTest, Normalization) {
  Dataset d;
  d.rows = 1;
  d.cols = 3;
  d.pixels = {0, 255, 51, /*second image*/ 128, 128, 128};
  d.labels = {7, 2};
  BatcherOptions options;
  options.shuffle = false;
  Batcher b = MustCreate(&d, options);
  Batch batch;
  ASSERT_TRUE(b.Next(&batch));
  EXPECT_EQ(batch.n, 2);
  EXPECT_EQ(batch.channels, 1);
  EXPECT_EQ(batch.height, 1);
  EXPECT_EQ(batch.width, 3);
  ASSERT_EQ(batch.images.size(), 6u);
  EXPECT_EQ(batch.labels, (std::vector<int32_t>{7, 2}));
  EXPECT_EQ(batch.indices, (std::vector<int64_t>{0, 1}));
  EXPECT_NEAR(batch.images[0], (0.0 - 0.2860) / 0.3530, 1e-5);
  EXPECT_NEAR(batch.images[1], (1.0 - 0.2860) / 0.3530, 1e-5);
  EXPECT_NEAR(batch.images[2], (0.2 - 0.2860) / 0.3530, 1e-5);
  EXPECT_NEAR(batch.images[3], (128 / 255.0 - 0.2860) / 0.3530, 1e-5);

  options.mean = 0.5f;
  options.std = 0.5f;
  Batcher c = MustCreate(&d, options);
  ASSERT_TRUE(c.Next(&batch));
  EXPECT_FLOAT_EQ(batch.images[0], -1.0f);
  EXPECT_FLOAT_EQ(batch.images[1], 1.0f);
}

TEST(BatcherTest, BadOptions) {
  const Dataset d = Small(10);
  auto code = [&](const Dataset* dataset, BatcherOptions options) {
    return Batcher::Create(dataset, options).status().code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  BatcherOptions good;
  good.num_workers = 2;
  EXPECT_EQ(code(&d, good), absl::StatusCode::kOk);

  BatcherOptions o = good;
  o.worker = 2;
  EXPECT_EQ(code(&d, o), kInvalid);
  o.worker = -1;
  EXPECT_EQ(code(&d, o), kInvalid);
  o = good;
  o.num_workers = 0;
  o.worker = 0;
  EXPECT_EQ(code(&d, o), kInvalid);
  o = good;
  o.batch_size = 0;
  EXPECT_EQ(code(&d, o), kInvalid);
  o = good;
  o.limit = -1;
  EXPECT_EQ(code(&d, o), kInvalid);
  o = good;
  o.std = 0;
  EXPECT_EQ(code(&d, o), kInvalid);
  o.std = -1;
  EXPECT_EQ(code(&d, o), kInvalid);
  o.std = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(code(&d, o), kInvalid);
  o = good;
  o.mean = std::numeric_limits<float>::infinity();
  EXPECT_EQ(code(&d, o), kInvalid);

  EXPECT_EQ(code(nullptr, good), kInvalid);
  Dataset empty;
  empty.rows = empty.cols = 28;
  EXPECT_EQ(code(&empty, good), kInvalid);
  Dataset short_pixels = d;
  short_pixels.pixels.pop_back();
  EXPECT_EQ(code(&short_pixels, good), kInvalid);
  Dataset bad_label = d;
  bad_label.labels[3] = 10;
  EXPECT_EQ(code(&bad_label, good), kInvalid);
  Dataset no_rows = d;
  no_rows.rows = 0;
  EXPECT_EQ(code(&no_rows, good), kInvalid);
}

// A batcher resized at step N (SetNumWorkers) yields what a batcher created
// with the new count and the same epoch cut yields from N: the elastic run
// and the restarted one read the same batches.
TEST(BatcherTest, ResizedEqualsRestarted) {
  const Dataset d = Small(100);
  BatcherOptions base;
  base.num_workers = 2;
  base.batch_size = 8;
  base.seed = 3;
  constexpr int64_t kResizeAt = 2;
  for (int w : {1, 3, 4}) {
    for (int v = 0; v < std::min(w, 2); ++v) {
      BatcherOptions o = base;
      o.worker = v;
      Batcher elastic = MustCreate(&d, o);
      elastic.StartEpoch(1);
      Batch a, b;
      for (int64_t k = 0; k < kResizeAt; ++k) ASSERT_TRUE(elastic.Next(&a));
      ASSERT_TRUE(elastic.SetNumWorkers(w).ok());
      o.num_workers = w;
      o.epoch_workers = 2;
      Batcher restarted = MustCreate(&d, o);
      restarted.StartEpoch(1);
      EXPECT_EQ(restarted.batches_per_epoch(), elastic.batches_per_epoch());
      for (int64_t k = 0; k < kResizeAt; ++k) ASSERT_TRUE(restarted.Next(&b));
      while (elastic.Next(&a)) {
        ASSERT_TRUE(restarted.Next(&b));
        EXPECT_EQ(a.indices, b.indices);
        EXPECT_EQ(a.images, b.images);
        EXPECT_EQ(a.labels, b.labels);
      }
      EXPECT_FALSE(restarted.Next(&b));
    }
  }
  BatcherOptions o = base;
  o.worker = 1;
  Batcher one = MustCreate(&d, o);
  EXPECT_EQ(one.SetNumWorkers(1).code(), absl::StatusCode::kInvalidArgument);
  o.epoch_workers = -1;
  EXPECT_EQ(Batcher::Create(&d, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bnps::worker
