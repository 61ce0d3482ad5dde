// What one ps_benchmark run measures and for how long, from its flags: the BN
// latency rows (C x W) and their timing, the grad table's shard counts and
// reps, and which systems take part. Filled once by main before anything is
// measured, then only read.

#ifndef BNPS_BENCH_SETTINGS_H_
#define BNPS_BENCH_SETTINGS_H_

#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace bnps::bench {

struct Settings {
  int warmup = 20;     // BN calls per worker before timing
  int reps = 1000;     // most BN calls timed per worker
  int min_reps = 100;  // fewest; between the two, the row's time decides
  absl::Duration row_time = absl::Milliseconds(500);
  int rounds = 3;  // measurements of each row (BN and grad)
  absl::Duration row_budget = absl::Seconds(20);  // per latency row and peer
  std::vector<int> channels;                      // C of the BN rows
  std::vector<int> workers;                       // W of the BN rows
  std::vector<int> shard_counts = {1, 2};
  // Which systems are measured (--systems); a skipped one's cells say so.
  bool bnps = true, gloo = true, echo = true, star = true, tcp = true;
  // Also measure every bnps row with the server's metrics off, beside the
  // usual one (metrics on), alternating which goes first (--metrics_ab).
  bool metrics_ab = false;
  // bnps workers' GrpcClientOptions::bn_spin (--bn_spin_us).
  absl::Duration bn_spin = absl::ZeroDuration();
  // bnps's BN traffic over raw TCP (the server's bn_port), as the launcher
  // runs it; false: over the gRPC stream (--bn_over_tcp).
  bool bn_over_tcp = true;
  // By MB: about 2 s of each system per row. With a quarter of these (and
  // cells the median of so few reps) a row's ratio moved by 0.3 between runs.
  std::map<int, int> push_pull_reps = {{1, 160}, {16, 60}, {64, 36}};
};

// The result of a system left out by --systems; the tables print "skipped".
inline absl::Status Skipped() {
  return absl::CancelledError("not in --systems");
}

}  // namespace bnps::bench

#endif  // BNPS_BENCH_SETTINGS_H_
