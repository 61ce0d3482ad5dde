#include "util/byte_budget.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace bnps::util {
namespace {

TEST(ByteBudgetTest, ChargesWhatFitsAndNoMore) {
  ByteBudget b(100);
  EXPECT_TRUE(b.TryCharge(60));
  EXPECT_FALSE(b.TryCharge(41));  // refused whole
  EXPECT_EQ(b.used(), 60);
  EXPECT_EQ(b.ChargeUpTo(70), 40);  // cut to what fits
  EXPECT_EQ(b.left(), 0);
  EXPECT_EQ(b.ChargeUpTo(1), 0);
  b.Release(30);
  EXPECT_TRUE(b.TryCharge(30));
  EXPECT_EQ(b.used(), 100);
}

// Many holders at once never push the total past the limit (a
// server-wide bound, not one per connection).
TEST(ByteBudgetTest, LastingChargesLeaveHalfForAnswers) {
  ByteBudget b(100);
  EXPECT_TRUE(b.TryChargeLasting(30));
  EXPECT_FALSE(b.TryChargeLasting(21));  // past half
  EXPECT_EQ(b.used(), 30);
  EXPECT_TRUE(b.TryChargeLasting(20));
  EXPECT_TRUE(b.TryCharge(50));  // answers take the other half
  EXPECT_FALSE(b.TryChargeLasting(0 + 1));
  b.Release(60);
  EXPECT_FALSE(b.TryChargeLasting(11));  // 40 held: 10 of the half left
  EXPECT_TRUE(b.TryChargeLasting(10));
}

TEST(ByteBudgetTest, ConcurrentHoldersStayWithinTheLimit) {
  ByteBudget b(1000);
  std::atomic<int64_t> peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&b, &peak, t] {
      for (int i = 0; i < 20000; ++i) {
        const int64_t n = 1 + (i * 7 + t) % 300;
        const int64_t got = (i % 2) ? b.ChargeUpTo(n) : (b.TryCharge(n) ? n : 0);
        int64_t seen = b.used();
        int64_t p = peak.load();
        while (seen > p && !peak.compare_exchange_weak(p, seen)) {
        }
        b.Release(got);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(peak.load(), 1000);
  EXPECT_EQ(b.used(), 0);
}

}  // namespace
}  // namespace bnps::util
