// The gradient push + pull table: one worker moving a 1, 16 or 64 MB
// gradient to S shard servers and the parameters back, bnps against raw gRPC
// (echo) moving the same bytes. Each system's reps of a row run in a grad
// child (grad_child.h).
//
// Thread-safety: plain functions; one thread measures.

#ifndef BNPS_BENCH_THROUGHPUT_TABLE_H_
#define BNPS_BENCH_THROUGHPUT_TABLE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "bench/settings.h"

namespace bnps::bench {

// bnps and echo push + pull throughput (MB/s) for one payload and S servers.
struct ThroughputRow {
  int mb = 0;
  int shards = 0;
  std::vector<int> keys_per_shard;
  absl::StatusOr<double> bnps = absl::UnknownError("not run");
  absl::StatusOr<double> echo = absl::UnknownError("not run");
};

// Measures the table's rows (s.shard_counts x 1, 16, 64 MB). Each system's
// reps of a row run in a fresh process (RunGradChild), so neither system
// runs in the heap the other left: in one process, reps alternating, the echo
// ran about 1.5x faster than it does alone. To see the same machine, the rows
// are measured in s.rounds rounds, the two systems one after the other in
// each, the first of them alternating; a cell is 2 * bytes over the median of
// all its reps, or the first error of its system's rounds.
std::vector<ThroughputRow> MeasureThroughput(const Settings& s);

}  // namespace bnps::bench

#endif  // BNPS_BENCH_THROUGHPUT_TABLE_H_
