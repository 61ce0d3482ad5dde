#include "server/scratch_pool.h"

#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace bnps::server {
namespace {

constexpr size_t kBig = ScratchPool::kMinPooledBytes / sizeof(float);

TEST(ScratchPoolTest, ReusesAGivenBackBuffer) {
  ScratchPool pool(size_t{64} << 20);
  const size_t n = 2 * kBig;
  float* first;
  {
    ScratchPool::Buffer b = pool.Take(n);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_GE(b.capacity(), n);
    for (size_t i = 0; i < n; ++i) b.data()[i] = static_cast<float>(i);
    first = b.data();
    EXPECT_EQ(pool.kept(), 0u);
  }
  EXPECT_EQ(pool.kept(), 1u);
  EXPECT_EQ(pool.kept_bytes(), n * sizeof(float));
  // A smaller request fits in it; the pool hands the same memory out again.
  ScratchPool::Buffer again = pool.Take(kBig);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(again.capacity(), n);
  EXPECT_EQ(pool.kept(), 0u);
  // A larger one does not fit: fresh memory.
  ScratchPool::Buffer larger = pool.Take(n + 1);
  EXPECT_NE(larger.data(), first);
  EXPECT_GE(larger.capacity(), n + 1);
}

TEST(ScratchPoolTest, PrefersTheSmallestBufferThatFits) {
  ScratchPool pool(size_t{64} << 20);
  float* small;
  float* large;
  {
    ScratchPool::Buffer a = pool.Take(kBig);
    ScratchPool::Buffer b = pool.Take(4 * kBig);
    small = a.data();
    large = b.data();
  }
  ASSERT_EQ(pool.kept(), 2u);
  ScratchPool::Buffer c = pool.Take(2 * kBig);
  EXPECT_EQ(c.data(), large);
  ScratchPool::Buffer d = pool.Take(kBig);
  EXPECT_EQ(d.data(), small);
}

TEST(ScratchPoolTest, KeepsNoMoreThanItsLimit) {
  ScratchPool pool(3 * kBig * sizeof(float));
  {
    std::vector<ScratchPool::Buffer> held;
    for (int i = 0; i < 5; ++i) held.push_back(pool.Take(kBig));
  }
  EXPECT_EQ(pool.kept(), 3u);
  EXPECT_EQ(pool.kept_bytes(), 3 * kBig * sizeof(float));
}

TEST(ScratchPoolTest, SmallBuffersAreNotPooled) {
  ScratchPool pool(size_t{64} << 20);
  {
    ScratchPool::Buffer b = pool.Take(10);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_GE(b.capacity(), 10u);
    ScratchPool::Buffer empty = pool.Take(0);
    EXPECT_NE(empty.data(), nullptr);
  }
  EXPECT_EQ(pool.kept(), 0u);
}

TEST(ScratchPoolTest, MovedBuffersGoBackOnce) {
  ScratchPool pool(size_t{64} << 20);
  {
    ScratchPool::Buffer a = pool.Take(kBig);
    ScratchPool::Buffer b = std::move(a);
    EXPECT_EQ(a.data(), nullptr);
    ScratchPool::Buffer c;
    c = std::move(b);
    c = pool.Take(2 * kBig);  // the first goes back here
    EXPECT_EQ(pool.kept(), 1u);
  }
  EXPECT_EQ(pool.kept(), 2u);
}

TEST(ScratchPoolTest, LargestTakenCountsCapacityHandedOut) {
  ScratchPool pool(size_t{256} << 20);
  EXPECT_EQ(pool.largest_taken_bytes(), 0u);
  { ScratchPool::Buffer small = pool.Take(3); }
  EXPECT_EQ(pool.largest_taken_bytes(), 3 * sizeof(float));
  { ScratchPool::Buffer big = pool.Take(2 * kBig); }
  EXPECT_EQ(pool.largest_taken_bytes(), 2 * kBig * sizeof(float));
  // A smaller request served by the kept buffer hands out all of it.
  { ScratchPool::Buffer reused = pool.Take(kBig); }
  EXPECT_EQ(pool.largest_taken_bytes(), 2 * kBig * sizeof(float));
  { ScratchPool::Buffer small = pool.Take(1); }
  EXPECT_EQ(pool.largest_taken_bytes(), 2 * kBig * sizeof(float));
}

TEST(ScratchPoolTest, ConcurrentTakersGetDistinctBuffers) {
  ScratchPool pool(size_t{256} << 20);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 200; ++i) {
        ScratchPool::Buffer b = pool.Take(kBig + t);
        for (size_t j = 0; j < 64; ++j) b.data()[j] = static_cast<float>(t);
        for (size_t j = 0; j < 64; ++j) ASSERT_EQ(b.data()[j], t);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(pool.kept(), 4u);
  EXPECT_GE(pool.kept(), 1u);
}

}  // namespace
}  // namespace bnps::server
