#include "bench/timing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"

namespace bnps::bench {

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * v.size()));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

absl::StatusOr<Latency> Summarize(const std::vector<std::vector<double>>& us) {
  Latency l;
  l.samples = static_cast<int>(us[0].size());
  for (const std::vector<double>& w : us) {
    if (w.empty()) return absl::DeadlineExceededError("no call was timed");
    l.p50_us = std::max(l.p50_us, Percentile(w, 0.50));
    l.p99_us = std::max(l.p99_us, Percentile(w, 0.99));
    l.samples = std::min(l.samples, static_cast<int>(w.size()));
  }
  return l;
}

absl::StatusOr<Latency> MedianOfRounds(
    const std::vector<absl::StatusOr<Latency>>& rounds) {
  std::vector<double> p50, p99;
  int samples = std::numeric_limits<int>::max();
  for (const absl::StatusOr<Latency>& r : rounds) {
    if (!r.ok()) return r.status();
    p50.push_back(r->p50_us);
    p99.push_back(r->p99_us);
    samples = std::min(samples, r->samples);
  }
  Latency l;
  l.p50_us = Percentile(p50, 0.5);
  l.p99_us = Percentile(p99, 0.5);
  l.samples = samples;
  return l;
}

}  // namespace bnps::bench
