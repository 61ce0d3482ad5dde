// Timing for the benchmarks that print tables (bn/, server/): the median wall
// time of a piece of work over repeated runs.

#ifndef BNPS_UTIL_MEDIAN_TIME_H_
#define BNPS_UTIL_MEDIAN_TIME_H_

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace bnps::util {

// Runs `fn` once untimed (it pages in its buffers and fills the caches, as
// steady work would), then `reps` times; the median seconds of those runs.
// REQUIRES: reps >= 1.
inline double MedianSeconds(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - start)
                        .count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2,
                   times.end());
  return times[times.size() / 2];
}

}  // namespace bnps::util

#endif  // BNPS_UTIL_MEDIAN_TIME_H_
