// Eventually: for tests that wait for another thread to reach a state. Polls
// `pred` every millisecond for at most 10 s and says whether it came true; the
// wait is bounded, never timed.

#ifndef BNPS_UTIL_EVENTUALLY_H_
#define BNPS_UTIL_EVENTUALLY_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace bnps::util {

template <typename Pred>
bool Eventually(Pred pred) {
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return pred();
}

}  // namespace bnps::util

#endif  // BNPS_UTIL_EVENTUALLY_H_
