#include "worker/data/elastic_shard.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace bnps::worker {
namespace {

std::vector<int64_t> Union(const EpochCut& cut, int64_t k, int workers) {
  std::vector<int64_t> all;
  for (int v = 0; v < workers; ++v) {
    const std::vector<int64_t> p = StepPositions(cut, k, v, workers);
    all.insert(all.end(), p.begin(), p.end());
  }
  return all;
}

int64_t Steps(const EpochCut& cut) {
  const int64_t largest =
      (cut.examples + cut.base_workers - 1) / cut.base_workers;
  return cut.drop_last ? largest / cut.batch_size
                       : (largest + cut.batch_size - 1) / cut.batch_size;
}

TEST(ElasticShardTest, TheBaseCountIsTheContiguousShardRule) {
  const EpochCut cut{/*examples=*/103, /*base_workers=*/4, /*batch_size=*/8,
                     /*drop_last=*/false};
  for (int v = 0; v < 4; ++v) {
    const int64_t begin = v * 103 / 4, end = (v + 1) * 103 / 4;
    for (int64_t k = 0; k < Steps(cut); ++k) {
      std::vector<int64_t> want;
      for (int64_t i = begin + k * 8; i < std::min(end, begin + (k + 1) * 8); ++i) {
        want.push_back(i);
      }
      EXPECT_EQ(StepPositions(cut, k, v, 4), want) << v << " " << k;
    }
  }
}

// The global batch of a step is the same whatever the step's count, so a
// resize at any step trains on what a fixed job would; each count uses every
// example once per epoch.
TEST(ElasticShardTest, GlobalBatchDoesNotDependOnTheCount) {
  for (bool drop_last : {false, true}) {
    for (int64_t n : {1, 7, 64, 103}) {
      const EpochCut cut{n, /*base_workers=*/2, /*batch_size=*/5, drop_last};
      std::vector<int64_t> epoch;
      for (int64_t k = 0; k < Steps(cut); ++k) {
        std::vector<int64_t> base = Union(cut, k, 2);
        std::sort(base.begin(), base.end());
        for (int w : {1, 3, 4, 7, 64}) {
          std::vector<int64_t> got = Union(cut, k, w);
          std::sort(got.begin(), got.end());
          EXPECT_EQ(got, base) << n << " " << k << " " << w;
          // Split evenly: sizes differ by at most one.
          size_t lo = SIZE_MAX, hi = 0;
          for (int v = 0; v < w; ++v) {
            const size_t s = StepPositions(cut, k, v, w).size();
            lo = std::min(lo, s);
            hi = std::max(hi, s);
          }
          EXPECT_LE(hi - lo, 1u);
        }
        epoch.insert(epoch.end(), base.begin(), base.end());
      }
      std::sort(epoch.begin(), epoch.end());
      EXPECT_TRUE(std::adjacent_find(epoch.begin(), epoch.end()) == epoch.end());
      if (!drop_last) {
        EXPECT_EQ(static_cast<int64_t>(epoch.size()), n);
      }
    }
  }
}

TEST(ElasticShardTest, OutOfRangeGivesNothing) {
  const EpochCut cut{16, 2, 4, false};
  EXPECT_TRUE(StepPositions(cut, 0, 2, 2).empty());
  EXPECT_TRUE(StepPositions(cut, 0, -1, 2).empty());
  EXPECT_TRUE(StepPositions(cut, 0, 0, 0).empty());
  EXPECT_TRUE(StepPositions(cut, 2, 0, 2).empty());  // past the epoch
  EXPECT_TRUE(StepPositions(cut, -1, 0, 3).empty());
  EXPECT_TRUE(StepPositions(EpochCut{16, 0, 4, false}, 0, 0, 1).empty());
}

}  // namespace
}  // namespace bnps::worker
