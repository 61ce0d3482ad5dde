// Fast scans for values a message must not carry: NaN and infinity, and (for
// sums of squares) negative numbers.
//
// Every BN message and every pushed tensor is checked on its way in, so these
// scans sit on the latency path of each BN-sync call. They look at the bits
// in 32-bit words, without branches, so the compiler vectorizes them even with
// the instructions every x86-64 has (SSE2 compares 32-bit integers but not
// 64-bit ones or, portably, doubles by class), and with AVX2 or AVX-512 where
// the CPU has them (util/cpu_clones.h); a hit is then located by a plain loop.
//
// Example:
//   if (size_t i = FirstNonFinite(values); i < values.size()) {
//     return absl::InvalidArgumentError(absl::StrCat("element ", i, "..."));
//   }
//
// Thread-safety: pure functions.

#ifndef BNPS_UTIL_FINITE_H_
#define BNPS_UTIL_FINITE_H_

#include <cstddef>

#include "absl/types/span.h"

namespace bnps::util {

// The index of the first NaN or infinity in `v`, or v.size() if there is none.
size_t FirstNonFinite(absl::Span<const double> v);
size_t FirstNonFinite(absl::Span<const float> v);

// The index of the first value of `v` that is NaN, infinite or below zero
// (-0.0 is not), or v.size() if there is none: the check of a sum of squares
// or a variance.
size_t FirstNotFiniteNonNegative(absl::Span<const double> v);

// The index of the first value of `v` that is not zero (NaN is not zero;
// -0.0 is), or v.size() if every value is zero.
size_t FirstNonZero(absl::Span<const double> v);

}  // namespace bnps::util

#endif  // BNPS_UTIL_FINITE_H_
