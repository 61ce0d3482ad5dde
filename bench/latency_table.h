// The BN-sync latency table: the round trip of one BN layer's forward
// exchange, C channels, W workers, for bnps and its peers (gloo, echo, star,
// tcp),
// each row's systems measured one after another, in --rounds rounds. The
// workers are the pool's processes; RunLatencyJob is what each of them runs.
//
// Thread-safety: plain functions; one thread measures.

#ifndef BNPS_BENCH_LATENCY_TABLE_H_
#define BNPS_BENCH_LATENCY_TABLE_H_

#include <map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/latency_job.h"
#include "bench/settings.h"
#include "bench/timing.h"
#include "bench/worker_pool.h"

namespace bnps::bench {

// A system's cells, by (C, W): the median over rounds, or why there is none
// (Skipped() for a system left out).
using LatencyCells = std::map<std::pair<int, int>, absl::StatusOr<Latency>>;

struct LatencyTable {
  LatencyCells bnps, gloo, echo, star, tcp;
  // bnps with the server's metrics off; only with Settings::metrics_ab.
  LatencyCells bnps_no_metrics;
};

// The JobRunner of the pool (worker_pool.h): runs `job` with the worker of
// its peer (BnpsWorker, GlooWorker, EchoWorker or TcpStarWorker).
absl::StatusOr<std::vector<double>> RunLatencyJob(const Job& job,
                                                  RowControl* control);

// Measures every row of s.channels x s.workers for the systems `s` names.
// Each round measures every row, and in each row every system one after
// another, so that all see the same machine; a cell is the median over
// rounds. REQUIRES: the pool has max(s.workers) processes running
// RunLatencyJob.
LatencyTable MeasureLatency(WorkerPool& pool, const Settings& s);

}  // namespace bnps::bench

#endif  // BNPS_BENCH_LATENCY_TABLE_H_
