#include "bench/latency_table.h"

#include <memory>

#include "absl/status/status.h"
#include "bench/bnps_peer.h"
#include "bench/echo_peer.h"
#include "bench/echo_server.h"
#include "bench/gloo_peer.h"
#include "bench/tcp_star.h"

namespace bnps::bench {

absl::StatusOr<std::vector<double>> RunLatencyJob(const Job& job,
                                                  RowControl* control) {
  switch (job.peer) {
    case Peer::kBnps:
      return BnpsWorker(job, control);
    case Peer::kGloo:
      return GlooWorker(job, control);
    case Peer::kEcho:
    case Peer::kStar:
      return EchoWorker(job, control);
    case Peer::kTcp:
      return TcpStarWorker(job, control);
  }
  return absl::InvalidArgumentError("unknown peer");
}

LatencyTable MeasureLatency(WorkerPool& pool, const Settings& s) {
  using Rounds =
      std::map<std::pair<int, int>, std::vector<absl::StatusOr<Latency>>>;
  Rounds gloo, bnps, echo, star, tcp, bnps_off;
  absl::StatusOr<std::unique_ptr<EchoServer>> echo_server =
      s.echo || s.star ? EchoServer::Start() : Skipped();
  absl::StatusOr<std::unique_ptr<TcpStarServer>> tcp_server =
      s.tcp ? TcpStarServer::Start() : Skipped();
  for (int round = 0; round < s.rounds; ++round) {
    for (int c : s.channels) {
      for (int w : s.workers) {
        const std::pair<int, int> key(c, w);
        if (s.metrics_ab) {
          // On and off back to back, the first alternating by round, so
          // that drift of the machine does not favour one.
          const bool off_first = round % 2 == 1;
          if (off_first) bnps_off[key].push_back(BnpsLatency(pool, c, w, s, false));
          bnps[key].push_back(BnpsLatency(pool, c, w, s, true));
          if (!off_first) bnps_off[key].push_back(BnpsLatency(pool, c, w, s, false));
        } else {
          bnps[key].push_back(s.bnps ? BnpsLatency(pool, c, w, s) : Skipped());
        }
        gloo[key].push_back(s.gloo ? GlooLatency(pool, c, w, s) : Skipped());
        for (const bool gather : {false, true}) {
          absl::StatusOr<Latency> l = Skipped();
          if ((gather ? s.star : s.echo) && echo_server.ok()) {
            l = EchoLatency(pool, **echo_server, c, w, gather, s);
          } else if (gather ? s.star : s.echo) {
            l = echo_server.status();
          }
          (gather ? star : echo)[key].push_back(std::move(l));
        }
        tcp[key].push_back(
            !s.tcp ? Skipped()
            : tcp_server.ok()
                ? TcpStarLatency(pool, **tcp_server, c, w, s)
                : absl::StatusOr<Latency>(tcp_server.status()));
      }
    }
  }
  echo_server = absl::CancelledError("done");
  tcp_server = absl::CancelledError("done");
  auto medians = [](const Rounds& rounds) {
    LatencyCells out;
    for (const auto& [key, r] : rounds) out.emplace(key, MedianOfRounds(r));
    return out;
  };
  LatencyTable table;
  table.bnps = medians(bnps);
  table.gloo = medians(gloo);
  table.echo = medians(echo);
  table.star = medians(star);
  table.tcp = medians(tcp);
  table.bnps_no_metrics = medians(bnps_off);
  return table;
}

}  // namespace bnps::bench
