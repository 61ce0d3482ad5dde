// ps_benchmark: bnps against peers measured in the same run on this machine
// (docs/design.md, "Performance -- how it is measured"). Everything runs on
// 127.0.0.1; the tables give absolute times and the ratio bnps / peer.
//
// 1. BN-sync round trip of one layer, C channels, W workers
//    (latency_table.h). Every system's W workers are W processes, as in a
//    deployment (and as gloo's ranks must be): a pool forked when the
//    benchmark starts, before this process has any thread or gRPC state
//    (worker_pool.h); each row hands them its work over pipes. The systems of
//    a row run one after another. bnps (bnps_peer.h): one shard server (sync
//    policy) in this process; each worker has its own PsClient and calls
//    BnForward(layer, step, moments) back to back; each call returns after
//    the barrier. Its BN traffic goes over raw TCP as the launcher runs it
//    (--bn_over_tcp; false: the gRPC stream). Peers with the same bytes per worker (a forward exchange
//    carries count + mean[C] + m2[C] = 16C + 8 bytes each way):
//      gloo  ring allreduce of 2C doubles (the sum / sum of squares of an
//            allreduce-based SyncBN) among the W processes, TCP transport
//            (gloo_peer.h).
//      echo  raw gRPC: each worker with its own channel and bidi stream,
//            writing 16C + 8 bytes and reading them back from an echo server
//            in this process built like the shard server (callback API;
//            echo_server.h, echo_peer.h). The transport floor.
//      star  the same echo, except that the server answers a round only once
//            all W streams have sent theirs (the Gather method,
//            star_barrier.h): the floor under any barrier served over gRPC,
//            bnps's minus the work.
//      tcp   the star barrier on raw loopback TCP, without gRPC: one
//            connection per worker, one epoll thread answering a round once
//            all W frames are in (tcp_star.h). The floor under any barrier
//            over TCP on this machine.
//    Every worker times each of its calls after a warm-up, for --row_seconds
//    but at least --min_reps and at most --reps calls (CallPlan,
//    latency_job.h); a cell is the largest over workers of the per-worker p50
//    (or p99).
//
// 2. Gradient push + pull, one worker, S shard servers (throughput_table.h):
//    the tensor is split into parameters of at most 1M floats; a rep is
//    PushGradients(step) of all of them (shared, as the trainer pushes) and
//    PullParametersInto(step + 1) (sync, one worker: applied at once; into
//    the same buffers every rep, as the echo's reader reuses its message).
//    Peer: raw gRPC moving the same bytes in 1 MiB messages, a
//    client-streaming Upload then a server-streaming Download, split over S
//    echo servers in parallel as bnps splits over shards. Each system's reps
//    of a row run in a fresh process (this binary again, with --grad_child;
//    grad_child.h) holding its servers and client, so neither runs in the
//    heap the other left; the rows are measured in --rounds rounds with the
//    two systems back to back, the first alternating. Throughput is
//    2 * bytes / (median time of a rep); MB = 2^20 bytes. Both systems run
//    with the same heap settings (--heap_keep_mb, util/heap_flags.h; 0 for
//    glibc's defaults).
//
// The tables are printed as Markdown (report.h).
//
// Run: bazel build -c opt //bench:ps_benchmark &&
//      bazel-bin/bench/ps_benchmark [--reps=1000] [--min_reps=100]
//      [--row_seconds=0.5] [--quick]
//      [--tables=bn,grad] [--systems=bnps,gloo,echo,star,tcp]
//      [--channels=64,256,1024]
//      [--workers=1,2,4,8] [--bn_spin_us=0] [--bn_over_tcp=false]
//      [--heap_keep_mb=256]

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/grad_child.h"
#include "bench/latency_table.h"
#include "bench/report.h"
#include "bench/settings.h"
#include "bench/throughput_table.h"
#include "bench/worker_pool.h"
#include "util/heap_flags.h"

ABSL_FLAG(int, reps, 1000,
          "BN latency: the most timed calls per worker and row (a row stops "
          "earlier once it has --min_reps and has run --row_seconds)");
ABSL_FLAG(int, min_reps, 100,
          "BN latency: the fewest timed calls per worker and row");
ABSL_FLAG(double, row_seconds, 0.5,
          "BN latency: timing a row stops at the first call after this many "
          "seconds, once it has --min_reps calls");
ABSL_FLAG(int, rounds, 3,
          "how many times each row is measured, the rows and systems "
          "interleaved; a BN cell is the median over the rounds, a grad cell "
          "the median of all its reps (split over the rounds)");
ABSL_FLAG(bool, quick, false,
          "fewer reps: at most 50 BN calls per row, 1-3 push+pull reps");
ABSL_FLAG(std::vector<std::string>, systems,
          std::vector<std::string>({"bnps", "gloo", "echo", "star", "tcp"}),
          "which systems to measure: bnps, gloo, echo, star, tcp (the grad table "
          "has bnps and echo); fewer to profile one alone");
ABSL_FLAG(bool, metrics_ab, false,
          "BN latency: also measure every bnps row with the server's metrics "
          "off, and print a table of the round trip with metrics on and off "
          "(implies bnps in --systems)");
ABSL_FLAG(bool, bn_over_tcp, true,
          "bnps's BN traffic over raw TCP (the server's --bn_port, as the "
          "launcher runs it); false: over the gRPC stream");
ABSL_FLAG(int, bn_spin_us, 0,
          "BN latency: how long each bnps worker polls for its answer before "
          "it blocks (GrpcClientOptions::bn_spin)");
ABSL_FLAG(std::vector<std::string>, channels,
          std::vector<std::string>({"64", "256", "1024"}),
          "BN latency: the layer widths C, one row group each");
ABSL_FLAG(std::vector<std::string>, workers,
          std::vector<std::string>({"1", "2", "4", "8"}),
          "BN latency: the worker counts W of each row group");
ABSL_FLAG(std::string, grad_child, "",
          "internal, set by the grad table: SYSTEM,MB,S,REPS measures one "
          "system's push + pull reps (bnps or echo) in this process, prints "
          "their times and exits");
ABSL_FLAG(std::string, tables, "bn,grad",
          "which tables to measure, comma-separated: bn (BN-sync latency), "
          "grad (gradient push + pull throughput)");

namespace bnps::bench {
namespace {

// Parses a flag's list of positive integers into `out`.
bool PositiveInts(const std::vector<std::string>& in, absl::string_view flag,
                  int max, std::vector<int>* out) {
  for (const std::string& v : in) {
    int n;
    if (!absl::SimpleAtoi(v, &n) || n < 1 || n > max) {
      absl::FPrintF(stderr, "ps_benchmark: --%s: '%s' is not in [1, %d]\n",
                    flag, v, max);
      return false;
    }
    out->push_back(n);
  }
  if (out->empty()) {
    absl::FPrintF(stderr, "ps_benchmark: --%s is empty\n", flag);
    return false;
  }
  return true;
}

int Main() {
  if (absl::Status s = util::ApplyHeapFlag(); !s.ok()) {
    absl::FPrintF(stderr, "ps_benchmark: %s\n", s.message());
    return 2;
  }
  if (const std::string spec = absl::GetFlag(FLAGS_grad_child); !spec.empty()) {
    return GradChildMain(spec);
  }
  Settings s;
  if (!PositiveInts(absl::GetFlag(FLAGS_workers), "workers", 64, &s.workers)) {
    return 2;
  }
  if (!PositiveInts(absl::GetFlag(FLAGS_channels), "channels", 1 << 16,
                    &s.channels)) {
    return 2;
  }
  s.bnps = s.gloo = s.echo = s.star = s.tcp = false;
  for (const std::string& name : absl::GetFlag(FLAGS_systems)) {
    bool* on = name == "bnps"   ? &s.bnps
               : name == "gloo" ? &s.gloo
               : name == "echo" ? &s.echo
               : name == "star" ? &s.star
               : name == "tcp"  ? &s.tcp
                                : nullptr;
    if (on == nullptr) {
      absl::FPrintF(stderr,
                    "ps_benchmark: --systems: '%s' is not bnps, gloo, echo, "
                    "star or tcp\n",
                    name);
      return 2;
    }
    *on = true;
  }
  s.metrics_ab = absl::GetFlag(FLAGS_metrics_ab);
  s.bn_spin = absl::Microseconds(std::clamp(absl::GetFlag(FLAGS_bn_spin_us), 0,
                                            1000000));
  if (s.metrics_ab) s.bnps = true;
  s.bn_over_tcp = absl::GetFlag(FLAGS_bn_over_tcp);
  s.reps = std::max(1, absl::GetFlag(FLAGS_reps));
  s.min_reps = std::clamp(absl::GetFlag(FLAGS_min_reps), 1, s.reps);
  s.row_time = absl::Seconds(std::max(0.0, absl::GetFlag(FLAGS_row_seconds)));
  s.rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  if (absl::GetFlag(FLAGS_quick)) {
    s.warmup = 5;
    s.reps = std::min(s.reps, 50);
    s.min_reps = std::min(s.min_reps, s.reps);
    s.rounds = 1;
    s.row_budget = absl::Seconds(5);
    s.push_pull_reps = {{1, 3}, {16, 2}, {64, 1}};
  }
  absl::PrintF("# ps_benchmark\n\nmachine: %d cores, %s\n",
               std::thread::hardware_concurrency(), CpuModel());
  absl::PrintF(
      "settings: BN latency %d warm-up + %d to %d timed calls per worker and "
      "row (timing stops after %s once it has %d; at most %s a row), median "
      "of %d rounds; push+pull reps %s per system and row, split over the "
      "rounds, each system's share of a round in a fresh process after %d "
      "warm-up reps; S in {%s}; bnps's BN %s; %s; loopback "
      "127.0.0.1\n",
      s.warmup, s.min_reps, s.reps, absl::FormatDuration(s.row_time),
      s.min_reps, absl::FormatDuration(s.row_budget), s.rounds,
      absl::StrJoin(s.push_pull_reps, ", ",
                    [](std::string* out, const std::pair<const int, int>& p) {
                      absl::StrAppend(out, p.first, " MB: ", p.second);
                    }),
      kGradWarmup, absl::StrJoin(s.shard_counts, ", "),
      s.bn_over_tcp ? "over raw TCP (--bn_over_tcp)"
                    : "over the gRPC stream (--bn_over_tcp=false)",
      util::HeapKeepMbFlag() > 0
          ? absl::StrFormat("freed heap memory kept for reuse "
                            "(--heap_keep_mb=%d), bnps and echo alike",
                            util::HeapKeepMbFlag())
          : std::string("glibc's default heap thresholds (--heap_keep_mb=0)"));

  const std::string tables = absl::GetFlag(FLAGS_tables);
  const bool bn_table = absl::StrContains(tables, "bn");
  const bool grad_table = absl::StrContains(tables, "grad");
  if (!bn_table && !grad_table) {
    absl::FPrintF(stderr, "ps_benchmark: --tables=%s names no table\n", tables);
    return 2;
  }
  if (bn_table) {
    // First, while this process has no threads and no gRPC state.
    absl::StatusOr<std::unique_ptr<WorkerPool>> pool = WorkerPool::Fork(
        *std::max_element(s.workers.begin(), s.workers.end()), &RunLatencyJob);
    if (!pool.ok()) {
      absl::FPrintF(stderr, "ps_benchmark: %s\n", pool.status().ToString());
      return 1;
    }
    const LatencyTable table = MeasureLatency(**pool, s);
    PrintLatencyTable(table, s);
    if (s.metrics_ab) PrintMetricsCostTable(table, s);
  }
  if (grad_table) {
    PrintThroughputTable(MeasureThroughput(s));
  }
  return 0;
}

}  // namespace
}  // namespace bnps::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Debian builds Abseil with Mutex deadlock detection on, which records a
  // lock graph at every acquisition; the tests keep it, the binaries do not.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return bnps::bench::Main();
}
