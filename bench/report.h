// ps_benchmark's output: the two tables as Markdown on stdout, a failed cell
// as "fail[N]" with its error as footnote N below the table, a system left
// out as "skipped". bench/update_performance_md.py and
// ps_benchmark_test.py read these tables; change their shape with them.
//
// Thread-safety: plain functions, writing to stdout.

#ifndef BNPS_BENCH_REPORT_H_
#define BNPS_BENCH_REPORT_H_

#include <string>
#include <vector>

#include "bench/latency_table.h"
#include "bench/settings.h"
#include "bench/throughput_table.h"

namespace bnps::bench {

// The CPU's model name from /proc/cpuinfo, or "unknown".
std::string CpuModel();

// Prints the BN-sync latency table of every (C, W) in s.channels x
// s.workers. REQUIRES: `table` has a cell for each.
void PrintLatencyTable(const LatencyTable& table, const Settings& s);

// Prints bnps's BN round trip with the server's metrics on and off, and
// their ratio. REQUIRES: s.metrics_ab and a cell of each for every row.
void PrintMetricsCostTable(const LatencyTable& table, const Settings& s);

// Prints the gradient push + pull table.
void PrintThroughputTable(const std::vector<ThroughputRow>& rows);

}  // namespace bnps::bench

#endif  // BNPS_BENCH_REPORT_H_
