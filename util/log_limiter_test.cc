#include "util/log_limiter.h"

#include "gtest/gtest.h"

namespace bnps::util {
namespace {

TEST(LogLimiterTest, ABurstThenSoManyLinesASecondAndTheRestCounted) {
  LogLimiter limiter(/*burst=*/3, /*per_second=*/2);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int64_t left_out = -1;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limiter.Admit(t0 + absl::Milliseconds(i), &left_out));
    EXPECT_EQ(left_out, 0);
  }
  for (int i = 0; i < 1000; ++i) {
    EXPECT_FALSE(limiter.Admit(t0 + absl::Milliseconds(10), &left_out));
  }
  // Half a second later one more line, which says how many were left out.
  EXPECT_TRUE(limiter.Admit(t0 + absl::Milliseconds(510), &left_out));
  EXPECT_EQ(left_out, 1000);
  EXPECT_EQ(LogLimiter::LeftOut(left_out), " (1000 similar lines left out)");
  EXPECT_FALSE(limiter.Admit(t0 + absl::Milliseconds(520), &left_out));
  // A long quiet time refills the burst, no more.
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limiter.Admit(t0 + absl::Seconds(100), &left_out));
  }
  EXPECT_FALSE(limiter.Admit(t0 + absl::Seconds(100), &left_out));
  EXPECT_EQ(LogLimiter::LeftOut(0), "");
}

}  // namespace
}  // namespace bnps::util
