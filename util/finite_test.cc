#include "util/finite.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace bnps::util {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kMax = std::numeric_limits<double>::max();
constexpr double kTiny = std::numeric_limits<double>::denorm_min();

// The plain definitions the scans must agree with.
size_t RefNonFinite(const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) return i;
  }
  return v.size();
}
size_t RefNotFiniteNonNegative(const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i]) || v[i] < 0) return i;
  }
  return v.size();
}
size_t RefNonZero(const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!(v[i] == 0)) return i;
  }
  return v.size();
}

TEST(FiniteTest, EmptySpansHaveNoHit) {
  EXPECT_EQ(FirstNonFinite(absl::Span<const double>()), 0u);
  EXPECT_EQ(FirstNonFinite(absl::Span<const float>()), 0u);
  EXPECT_EQ(FirstNotFiniteNonNegative(absl::Span<const double>()), 0u);
  EXPECT_EQ(FirstNonZero(absl::Span<const double>()), 0u);
}

// Each special value at the head, inside and at the tail of spans of several
// lengths (shorter than, equal to and past a vector register's worth: 4 and
// 8 doubles, 8 and 16 floats).
TEST(FiniteTest, FindsEachSpecialValueWherever) {
  const double specials[] = {0.0,   -0.0,   1.5,  -1.5,  kMax, -kMax,
                             kTiny, -kTiny, kInf, -kInf, kNan, -kNan};
  for (size_t n : {1u, 2u, 3u, 4u, 7u, 8u, 16u, 17u, 1027u}) {
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      for (double special : specials) {
        std::vector<double> v(n, 0.25);
        v[at] = special;
        SCOPED_TRACE(testing::Message()
                     << "n " << n << " at " << at << " value " << special);
        EXPECT_EQ(FirstNonFinite(v), RefNonFinite(v));
        EXPECT_EQ(FirstNotFiniteNonNegative(v), RefNotFiniteNonNegative(v));
        std::vector<double> zeros(n, 0.0);
        zeros[at] = special;
        EXPECT_EQ(FirstNonZero(zeros), RefNonZero(zeros));
        std::vector<float> f(n, 0.25f);
        f[at] = static_cast<float>(special);
        const size_t want = std::isfinite(f[at]) ? n : at;
        EXPECT_EQ(FirstNonFinite(absl::MakeConstSpan(f)), want);
      }
    }
  }
}

TEST(FiniteTest, ReportsTheFirstOfSeveralHits) {
  std::vector<double> v(100, 1.0);
  v[40] = -2.0;
  v[41] = kNan;
  v[70] = -kInf;
  EXPECT_EQ(FirstNonFinite(v), 41u);
  EXPECT_EQ(FirstNotFiniteNonNegative(v), 40u);
  EXPECT_EQ(FirstNonZero(v), 0u);
  std::vector<float> f(100, 1.0f);
  f[63] = std::numeric_limits<float>::infinity();
  f[64] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(FirstNonFinite(absl::MakeConstSpan(f)), 63u);
}

// Random bit patterns cover every class of double (and NaNs with any
// payload); the scans must agree with the plain definitions on each.
TEST(FiniteTest, AgreesWithThePlainDefinitionsOnRandomBits) {
  std::mt19937_64 rng(20261122);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t n = 1 + rng() % 40;
    std::vector<double> v(n);
    for (double& x : v) {
      // Mostly ordinary values, so that hits fall anywhere in the span.
      const uint64_t bits = rng() % 8 == 0 ? rng() : 0;
      if (bits == 0) {
        x = (static_cast<double>(rng() % 1000) - 300.0) / 7.0;
      } else {
        std::memcpy(&x, &bits, sizeof(x));
      }
    }
    EXPECT_EQ(FirstNonFinite(v), RefNonFinite(v)) << "trial " << trial;
    EXPECT_EQ(FirstNotFiniteNonNegative(v), RefNotFiniteNonNegative(v))
        << "trial " << trial;
    EXPECT_EQ(FirstNonZero(v), RefNonZero(v)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace bnps::util
