#include "proto/sharding.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace bnps::proto {
namespace {

TEST(ShardingTest, Fnv1aKnownValues) {
  // Published FNV-1a 64-bit test vectors.
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(ShardingTest, InRangeAndSpread) {
  for (int shards : {1, 2, 3, 7}) {
    std::vector<int> hits(shards, 0);
    for (int i = 0; i < 400; ++i) {
      const int s = ShardForKey("param/layer" + std::to_string(i) + "/w", shards);
      ASSERT_GE(s, 0);
      ASSERT_LT(s, shards);
      ++hits[s];
    }
    for (int h : hits) EXPECT_GT(h, 400 / shards / 2) << shards;
  }
  EXPECT_EQ(ShardForKey("bn/conv1", 5), ShardForKey("bn/conv1", 5));
}

}  // namespace
}  // namespace bnps::proto
