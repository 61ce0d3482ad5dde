#include "tools/status_options.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "policy/job_flags.h"
#include "security/security_flags.h"

ABSL_FLAG(std::string, servers, "127.0.0.1:7000",
          "Comma-separated host:port of the shard servers, shard 0 first.");
ABSL_FLAG(int, timeout_ms, 3000,
          "Deadline of each call.");
ABSL_FLAG(bool, json, false,
          "Print one JSON document: {\"servers\": [{\"address\", \"status\" "
          "(the StatusResponse of proto/bnps.proto, field names as there) or "
          "\"error\"}]}.");
ABSL_FLAG(bool, watch, false,
          "Refresh the view in place every --interval_s until Ctrl-C: per "
          "shard, workers with their state, step and pushes, and the BN "
          "layers whose newest step waited longest.");
ABSL_FLAG(double, interval_s, 2, "Seconds between refreshes of --watch.");
ABSL_FLAG(int, count, 0,
          "With --watch: stop after this many refreshes (0: until Ctrl-C).");
ABSL_FLAG(std::string, export, "",
          "Write every shard's parameters and BN running statistics to this "
          "file as safetensors, with the names a PyTorch module loads "
          "(docs/server.md, 'The end of a job'), and exit. Reads without "
          "joining the job, so it works during the job, after it (servers "
          "with --keep_serving) and from servers restarted on its final "
          "checkpoints.");
ABSL_FLAG(bool, digest, false,
          "Print only one line, `params sha256 <hex> step <n>`: a SHA-256 over "
          "every shard's parameters and BN running statistics in key order "
          "(bit-identical runs give the same line), and the smallest "
          "parameter version of the shards.");

namespace bnps::tools {

absl::StatusOr<StatusOptions> StatusOptionsFromFlags() {
  StatusOptions o;
  o.reader.servers =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  if (o.reader.servers.empty()) {
    return absl::InvalidArgumentError("--servers is empty");
  }
  o.interval_s = absl::GetFlag(FLAGS_interval_s);
  o.count = absl::GetFlag(FLAGS_count);
  if (!(o.interval_s > 0) || o.count < 0) {
    return absl::InvalidArgumentError(
        "--interval_s must be positive and --count >= 0");
  }
  o.watch = absl::GetFlag(FLAGS_watch);
  o.json = absl::GetFlag(FLAGS_json);
  if (o.watch && o.json) {
    return absl::InvalidArgumentError("--watch and --json do not go together");
  }
  absl::StatusOr<security::ClientSecurity> security =
      security::SecurityFromFlags();
  if (!security.ok()) return security.status();
  o.reader.job = absl::GetFlag(FLAGS_job);
  o.reader.credentials = security->credentials;
  o.reader.token = security->token;
  o.reader.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  o.export_path = absl::GetFlag(FLAGS_export);
  o.digest = absl::GetFlag(FLAGS_digest);
  return o;
}

}  // namespace bnps::tools
