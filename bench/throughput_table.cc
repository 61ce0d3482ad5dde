#include "bench/throughput_table.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/sharding.h"
#include "bench/grad_child.h"
#include "bench/timing.h"

namespace bnps::bench {
namespace {

constexpr int kPayloadMB[] = {1, 16, 64};

}  // namespace

std::vector<ThroughputRow> MeasureThroughput(const Settings& s) {
  std::vector<ThroughputRow> rows;
  for (int shards : s.shard_counts) {
    for (int mb : kPayloadMB) {
      ThroughputRow row;
      row.mb = mb;
      row.shards = shards;
      row.keys_per_shard.assign(shards, 0);
      for (const auto& [key, n] : GradKeys(mb)) {
        ++row.keys_per_shard[proto::ShardForKey(key, shards)];
      }
      // A value until a round fails (then its error) or the end (then MB/s).
      row.bnps = s.bnps ? absl::StatusOr<double>(0.0) : Skipped();
      row.echo = s.echo ? absl::StatusOr<double>(0.0) : Skipped();
      rows.push_back(std::move(row));
    }
  }
  std::vector<std::vector<double>> bnps_reps(rows.size()),
      echo_reps(rows.size());
  for (int round = 0; round < s.rounds; ++round) {
    for (size_t i = 0; i < rows.size(); ++i) {
      ThroughputRow& row = rows[i];
      const int reps =
          std::max(1, (s.push_pull_reps.at(row.mb) + s.rounds - 1) / s.rounds);
      for (const bool bnps : {round % 2 == 0, round % 2 != 0}) {
        absl::StatusOr<double>& cell = bnps ? row.bnps : row.echo;
        if (!cell.ok()) continue;  // skipped, or failed in an earlier round
        absl::StatusOr<std::vector<double>> got = RunGradChild(absl::StrCat(
            bnps ? "bnps" : "echo", ",", row.mb, ",", row.shards, ",", reps));
        if (!got.ok()) {
          cell = got.status();
          continue;
        }
        std::vector<double>& all = (bnps ? bnps_reps : echo_reps)[i];
        all.insert(all.end(), got->begin(), got->end());
      }
    }
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const double mb_moved = 2.0 * rows[i].mb;  // up and down
    if (rows[i].bnps.ok()) {
      rows[i].bnps = mb_moved / Percentile(bnps_reps[i], 0.5);
    }
    if (rows[i].echo.ok()) {
      rows[i].echo = mb_moved / Percentile(echo_reps[i], 0.5);
    }
  }
  return rows;
}

}  // namespace bnps::bench
