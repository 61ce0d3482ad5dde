#include "util/finite.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "util/cpu_clones.h"

namespace bnps::util {
namespace {

// A double as two 32-bit words in memory; the high one holds the sign and the
// whole exponent.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
constexpr size_t kHighWord = 0;
#else
constexpr size_t kHighWord = 4;
#endif
constexpr size_t kLowWord = 4 - kHighWord;

uint32_t Word(const double* v, size_t i, size_t offset) {
  uint32_t w;
  std::memcpy(&w, reinterpret_cast<const char*>(v + i) + offset, sizeof(w));
  return w;
}

// Runs `bit_test` over v in one branch-free pass; only if some value hit, a
// second, plain pass with `is_hit` finds the first.
template <typename T, typename BitTest, typename ValueTest>
size_t FirstHit(absl::Span<const T> v, BitTest bit_test, ValueTest is_hit) {
  uint32_t any = 0;
  for (size_t i = 0; i < v.size(); ++i) any |= bit_test(v.data(), i);
  if (any == 0) return v.size();
  for (size_t i = 0; i < v.size(); ++i) {
    if (is_hit(v[i])) return i;
  }
  return v.size();  // not reached: the two tests agree
}

}  // namespace

BNPS_CPU_CLONES
size_t FirstNonFinite(absl::Span<const double> v) {
  constexpr uint32_t kExponent = 0x7ff00000u;
  return FirstHit(
      v,
      [](const double* p, size_t i) {
        return static_cast<uint32_t>((Word(p, i, kHighWord) & kExponent) ==
                                     kExponent);
      },
      [](double x) { return !std::isfinite(x); });
}

BNPS_CPU_CLONES
size_t FirstNonFinite(absl::Span<const float> v) {
  constexpr uint32_t kExponent = 0x7f800000u;
  return FirstHit(
      v,
      [](const float* p, size_t i) {
        uint32_t bits;
        std::memcpy(&bits, p + i, sizeof(bits));
        return static_cast<uint32_t>((bits & kExponent) == kExponent);
      },
      [](float x) { return !std::isfinite(x); });
}

BNPS_CPU_CLONES
size_t FirstNotFiniteNonNegative(absl::Span<const double> v) {
  // All exponent bits set (NaN, infinity), or the sign bit set on a non-zero
  // magnitude.
  return FirstHit(
      v,
      [](const double* p, size_t i) {
        constexpr uint32_t kExponent = 0x7ff00000u;
        const uint32_t high = Word(p, i, kHighWord);
        const uint32_t low = Word(p, i, kLowWord);
        return static_cast<uint32_t>((high & kExponent) == kExponent) |
               ((high >> 31) & static_cast<uint32_t>(((high << 1) | low) != 0));
      },
      [](double x) { return !std::isfinite(x) || x < 0; });
}

BNPS_CPU_CLONES
size_t FirstNonZero(absl::Span<const double> v) {
  return FirstHit(
      v,
      [](const double* p, size_t i) {
        return static_cast<uint32_t>(
            ((Word(p, i, kHighWord) << 1) | Word(p, i, kLowWord)) != 0);
      },
      [](double x) { return !(x == 0); });
}

}  // namespace bnps::util
