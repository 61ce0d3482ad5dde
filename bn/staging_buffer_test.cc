#include "bn/staging_buffer.h"

#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"

namespace bnps::bn {
namespace {

// Counts what the buffer asks of its allocator (single-threaded test).
struct Ledger {
  int live = 0;
  int failures_left = 0;
  std::vector<size_t> sizes;
};
Ledger* ledger = nullptr;  // set by each test, for the C-style callbacks

absl::Status CountingAllocate(size_t bytes, void** out) {
  if (ledger->failures_left > 0) {
    --ledger->failures_left;
    return absl::ResourceExhaustedError("no pinned memory left");
  }
  *out = std::malloc(bytes);
  ++ledger->live;
  ledger->sizes.push_back(bytes);
  return absl::OkStatus();
}

void CountingRelease(void* data) {
  std::free(data);
  --ledger->live;
}

constexpr StagingAllocator kCounting{CountingAllocate, CountingRelease};

class StagingBufferTest : public ::testing::Test {
 protected:
  StagingBufferTest() { ledger = &ledger_; }
  ~StagingBufferTest() override { ledger = nullptr; }
  Ledger ledger_;
};

TEST_F(StagingBufferTest, ASteadyLoopAllocatesOnce) {
  {
    StagingBuffer buffer(kCounting);
    // A training loop's exchanges: layers of 16, 32 and 64 channels, many steps.
    for (int step = 0; step < 100; ++step) {
      for (size_t channels : {16, 32, 64, 32, 16}) {
        double* values = nullptr;
        ASSERT_TRUE(buffer.Reserve(2 * channels, &values).ok());
        ASSERT_NE(values, nullptr);
        values[2 * channels - 1] = 1.0;  // the whole span is usable
      }
    }
    // Grown for 16, 32, then 64 channels in the first step; never again.
    EXPECT_EQ(buffer.allocations(), 3);
    EXPECT_EQ(buffer.capacity(), 2 * 64 * sizeof(double));
    EXPECT_EQ(ledger_.live, 1);
  }
  EXPECT_EQ(ledger_.live, 0);  // released with the buffer
}

TEST_F(StagingBufferTest, TypesShareTheBytes) {
  StagingBuffer buffer(kCounting);
  float* f = nullptr;
  ASSERT_TRUE(buffer.Reserve(64, &f).ok());  // 256 bytes
  double* d = nullptr;
  ASSERT_TRUE(buffer.Reserve(32, &d).ok());  // 256 bytes: no new allocation
  EXPECT_EQ(static_cast<void*>(f), static_cast<void*>(d));
  EXPECT_EQ(buffer.allocations(), 1);
}

TEST_F(StagingBufferTest, AFailedAllocationLeavesItEmptyAndUsable) {
  StagingBuffer buffer(kCounting);
  float* f = nullptr;
  ASSERT_TRUE(buffer.Reserve(8, &f).ok());
  ledger_.failures_left = 1;
  absl::Status s = buffer.Reserve(1024, &f);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(buffer.capacity(), 0u);
  EXPECT_EQ(ledger_.live, 0);
  ASSERT_TRUE(buffer.Reserve(1024, &f).ok());
  EXPECT_EQ(buffer.capacity(), 1024 * sizeof(float));
}

}  // namespace
}  // namespace bnps::bn
