// Timing shared by ps_benchmark's tables: the clock every call is timed with,
// nearest-rank percentiles, and a cell of the BN latency table (Latency),
// made from per-worker samples and then from rounds.
//
// Thread-safety: plain functions and values.

#ifndef BNPS_BENCH_TIMING_H_
#define BNPS_BENCH_TIMING_H_

#include <chrono>
#include <vector>

#include "absl/status/statusor.h"

namespace bnps::bench {

using Clock = std::chrono::steady_clock;

// One cell of the BN latency table.
struct Latency {
  double p50_us = 0;
  double p99_us = 0;
  int samples = 0;  // per worker (the fewest)
};

// Microseconds from `t0` to now.
double MicrosSince(Clock::time_point t0);

// Nearest-rank percentile, q in (0, 1]. REQUIRES: !v.empty().
double Percentile(std::vector<double> v, double q);

// The largest over workers of each worker's p50 and p99; `us` holds each
// worker's call times. DEADLINE_EXCEEDED if a worker timed no call.
// REQUIRES: !us.empty().
absl::StatusOr<Latency> Summarize(const std::vector<std::vector<double>>& us);

// The median over rounds of a row's p50s and of its p99s (the first error,
// if a round failed). REQUIRES: !rounds.empty().
absl::StatusOr<Latency> MedianOfRounds(
    const std::vector<absl::StatusOr<Latency>>& rounds);

}  // namespace bnps::bench

#endif  // BNPS_BENCH_TIMING_H_
