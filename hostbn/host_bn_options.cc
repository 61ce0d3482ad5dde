#include "hostbn/host_bn_options.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "metrics/metrics_flags.h"
#include "security/job_token.h"

ABSL_FLAG(std::string, host, "127.0.0.1",
          "The address to listen on (IPv4): the host's, or 127.0.0.1 when "
          "its workers reach it there.");
ABSL_FLAG(int, port, 7200, "The port to listen on; 0 picks a free one "
          "(printed).");
ABSL_FLAG(int, workers, 1,
          "The workers on this host (the aggregator waits for all of them "
          "in every BN round).");
ABSL_FLAG(std::string, token_file, "",
          "The job's token, as the servers' --token_file: workers must "
          "carry it (or, with --per_worker_tokens, their own), and the "
          "aggregator shows it to the shards.");
ABSL_FLAG(bool, per_worker_tokens, false,
          "With --token_file: accept each worker's own token "
          "(security/worker_token.h); needs --num_workers.");
ABSL_FLAG(int, num_workers, 0, "The job's workers (for --per_worker_tokens).");
ABSL_FLAG(std::vector<std::string>, shards, {},
          "The shards the aggregator may connect to, comma-separated: the "
          "servers' hosts (any BN port there) or their BN addresses "
          "host:port. A worker's hello naming another is refused, so the "
          "aggregator relays to no address a worker chooses. Empty: any "
          "(with --token_file a shard must still prove the job token before "
          "it gets anything but the hello).");

namespace bnps::hostbn {

absl::StatusOr<HostBnOptions> HostBnOptionsFromFlags() {
  HostBnOptions options;
  Aggregator::Options& o = options.aggregator;
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  o.workers = absl::GetFlag(FLAGS_workers);
  o.per_worker_tokens = absl::GetFlag(FLAGS_per_worker_tokens);
  o.num_workers = absl::GetFlag(FLAGS_num_workers);
  for (const std::string& shard : absl::GetFlag(FLAGS_shards)) {
    if (!shard.empty()) o.shards.insert(shard);
  }
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = security::ReadTokenFile(path);
    if (!token.ok()) return token.status();
    o.token = *std::move(token);
  }
  if (absl::Status s = metrics::CheckMetricsFlags(); !s.ok()) return s;
  return options;
}

}  // namespace bnps::hostbn
