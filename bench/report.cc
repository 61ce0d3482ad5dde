#include "bench/report.h"

#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace bnps::bench {
namespace {

// Collects errors as numbered footnotes.
class Notes {
 public:
  std::string Cell(const absl::Status& status) {
    if (status == Skipped()) return "skipped";
    notes_.push_back(status.ToString());
    return absl::StrCat("fail[", notes_.size(), "]");
  }
  void Print() const {
    for (size_t i = 0; i < notes_.size(); ++i) {
      absl::PrintF("[%d] %s\n", i + 1, notes_[i]);
    }
  }

 private:
  std::vector<std::string> notes_;
};

std::string Micros(double us) {
  return absl::StrFormat(us < 10 ? "%.1f" : "%.0f", us);
}

std::string Ratio(double a, double b) { return absl::StrFormat("%.2f", a / b); }

}  // namespace

std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

void PrintLatencyTable(const LatencyTable& table, const Settings& s) {
  Notes notes;
  absl::PrintF(
      "\n## BN-sync round trip, one layer (us; max over workers of each "
      "worker's p50 / p99; median of %d rounds)\n\n"
      "| C | W | bnps p50 | bnps p99 | gloo p50 | gloo p99 | echo p50 | "
      "echo p99 | star p50 | star p99 | tcp p50 | tcp p99 | bnps/gloo | "
      "bnps/echo | bnps/star | bnps/tcp | star/gloo | star/tcp |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      "---:|---:|---:|---:|\n",
      s.rounds);
  bool short_rows = false;
  // p50 ratio a/b, "-" where either failed or b is a local copy (gloo, W = 1).
  auto ratio = [](const absl::StatusOr<Latency>& a,
                  const absl::StatusOr<Latency>& b) -> std::string {
    if (!a.ok() || !b.ok() || b->p50_us < 1.0) return "-";
    return Ratio(a->p50_us, b->p50_us);
  };
  for (int c : s.channels) {
    for (int w : s.workers) {
      const std::pair<int, int> key(c, w);
      std::vector<std::string> cells = {absl::StrCat(c), absl::StrCat(w)};
      for (const LatencyCells* m :
           {&table.bnps, &table.gloo, &table.echo, &table.star, &table.tcp}) {
        const absl::StatusOr<Latency>& l = m->at(key);
        if (!l.ok()) {
          cells.push_back(notes.Cell(l.status()));
          cells.push_back("");
          continue;
        }
        const std::string mark = l->samples < s.min_reps ? "*" : "";
        short_rows |= !mark.empty();
        cells.push_back(absl::StrCat(Micros(l->p50_us), mark));
        cells.push_back(absl::StrCat(Micros(l->p99_us), mark));
      }
      const absl::StatusOr<Latency>& b = table.bnps.at(key);
      cells.push_back(ratio(b, table.gloo.at(key)));
      cells.push_back(ratio(b, table.echo.at(key)));
      cells.push_back(ratio(b, table.star.at(key)));
      cells.push_back(ratio(b, table.tcp.at(key)));
      cells.push_back(ratio(table.star.at(key), table.gloo.at(key)));
      cells.push_back(ratio(table.star.at(key), table.tcp.at(key)));
      absl::PrintF("| %s |\n", absl::StrJoin(cells, " | "));
    }
  }
  absl::PrintF(
      "\nRatios of p50s; < 1 means the first is faster. gloo with W = 1 is a "
      "local copy (no ratio). star: bare gRPC answering each round once all W "
      "are in, doing no work; bnps/star is the cost of bnps's work over that "
      "floor, star/gloo the floor against gloo. tcp: the same barrier on raw "
      "loopback TCP (one epoll thread, no gRPC); star/tcp is what gRPC costs "
      "over the kernel's loopback.\n");
  if (short_rows)
    absl::PrintF("\n* fewer than %d calls: the row ran out of time\n",
                 s.min_reps);
  notes.Print();
}

void PrintMetricsCostTable(const LatencyTable& table, const Settings& s) {
  Notes notes;
  absl::PrintF(
      "\n## Metrics cost: bnps BN round trip with the server's metrics on and "
      "off (us; as above; median of %d rounds, on and off back to back)\n\n"
      "| C | W | on p50 | off p50 | on p99 | off p99 | on/off p50 |\n"
      "|---:|---:|---:|---:|---:|---:|---:|\n",
      s.rounds);
  for (int c : s.channels) {
    for (int w : s.workers) {
      const std::pair<int, int> key(c, w);
      const absl::StatusOr<Latency>& on = table.bnps.at(key);
      const absl::StatusOr<Latency>& off = table.bnps_no_metrics.at(key);
      std::vector<std::string> cells = {absl::StrCat(c), absl::StrCat(w)};
      if (!on.ok() || !off.ok()) {
        cells.push_back(notes.Cell(!on.ok() ? on.status() : off.status()));
        for (int i = 0; i < 4; ++i) cells.push_back("");
      } else {
        cells.push_back(Micros(on->p50_us));
        cells.push_back(Micros(off->p50_us));
        cells.push_back(Micros(on->p99_us));
        cells.push_back(Micros(off->p99_us));
        cells.push_back(Ratio(on->p50_us, off->p50_us));
      }
      absl::PrintF("| %s |\n", absl::StrJoin(cells, " | "));
    }
  }
  notes.Print();
}

void PrintThroughputTable(const std::vector<ThroughputRow>& rows) {
  Notes notes;
  absl::PrintF(
      "\n## Gradient push + pull, W = 1 (MB/s = 2 * payload / median rep)\n\n"
      "| MB | S | keys per shard | bnps MB/s | echo MB/s | bnps/echo |\n"
      "|---:|---:|---:|---:|---:|---:|\n");
  for (const ThroughputRow& r : rows) {
    auto cell = [&](const absl::StatusOr<double>& v) {
      return v.ok() ? absl::StrFormat("%.0f", *v) : notes.Cell(v.status());
    };
    absl::PrintF("| %d | %d | %s | %s | %s | %s |\n", r.mb, r.shards,
                 absl::StrJoin(r.keys_per_shard, "+"), cell(r.bnps),
                 cell(r.echo),
                 r.bnps.ok() && r.echo.ok() ? Ratio(*r.bnps, *r.echo) : "-");
  }
  notes.Print();
}

}  // namespace bnps::bench
