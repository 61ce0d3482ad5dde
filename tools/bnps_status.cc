// bnps_status: shows what every shard server of a job knows, once, as JSON,
// or as a live view.
//
//   bnps_status --servers=127.0.0.1:7000,127.0.0.1:7001
//   bnps_status --servers=... --watch --interval_s=2
//   bnps_status --servers=... --json
//   bnps_status --servers=... --digest
//   bnps_status --servers=... --export=model.safetensors
//
// It reads through client::JobReader: it never joins the job.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/job_reader.h"
#include "client/state_export.h"
#include "proto/bnps.pb.h"
#include "security/security_flags.h"
#include "tools/status_view.h"
#include "policy/job_flags.h"
#include "util/command_line.h"

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

namespace {

std::vector<bnps::tools::ShardAnswer> Query(
    const bnps::client::JobReader& reader) {
  std::vector<bnps::tools::ShardAnswer> answers(reader.num_shards());
  for (int i = 0; i < reader.num_shards(); ++i) {
    answers[i].address = reader.options().servers[i];
    absl::StatusOr<bnps::proto::StatusResponse> s = reader.GetStatus(i);
    if (s.ok()) {
      answers[i].status = *std::move(s);
    } else {
      answers[i].error = std::string(s.status().message());
    }
  }
  return answers;
}

// Prints the --digest line; 1 if a server did not answer.
int PrintDigest(const bnps::client::JobReader& reader) {
  absl::StatusOr<bnps::client::JobDigest> d = reader.GetDigest();
  if (!d.ok()) {
    std::fprintf(stderr, "bnps_status: no digest: %s\n",
                 std::string(d.status().message()).c_str());
    return 1;
  }
  std::printf("params sha256 %s step %lld\n", d->sha256_hex.c_str(),
              static_cast<long long>(d->step));
  return 0;
}

// --export: reads every shard and writes the safetensors file; 1 on failure.
int Export(const bnps::client::JobReader& reader, const std::string& path) {
  absl::StatusOr<bnps::client::JobState> state = reader.ReadState();
  absl::Status s = state.status();
  if (s.ok()) s = bnps::client::WriteExport(*state, path);
  if (!s.ok()) {
    std::fprintf(stderr, "bnps_status: no export: %s\n",
                 std::string(s.message()).c_str());
    return 1;
  }
  std::printf("bnps_status: exported %zu parameters and %zu BN layers' "
              "running statistics of step %lld%s to %s\n",
              state->params.size(), state->running.size(),
              static_cast<long long>(state->step),
              state->job_complete ? " (the job is complete)"
                                  : " (the job is still running)",
              path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // --help exits 0; an unknown or malformed flag exits 2. Flags may come
  // from BNPS_* variables (util/env_flags.h).
  bnps::util::EnvFlagsOptions env;
  bnps::util::ParseCommandLine(
      argc, argv,
      "Shows the job configuration, the workers' liveness, steps and clocks, "
      "the parameter versions and the BN layers' barrier waits of every "
      "shard server: once, as JSON (--json), or refreshed in place "
      "(--watch); a digest of their state (--digest); or an export of the "
      "parameters and BN running statistics as safetensors (--export). It "
      "reads without joining the job.\n"
      "  bnps_status --servers=127.0.0.1:7000,127.0.0.1:7001 [--watch]\n"
      "  bnps_status --servers=... --export=model.safetensors\n"
      "Exit status: 0 when every server answered (--watch: the last time) or "
      "after --help; 1 when one did not; 2 for bad flags.",
      env);
  const std::vector<std::string> servers =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  if (servers.empty()) {
    std::fprintf(stderr, "bnps_status: --servers is empty\n");
    return bnps::util::kBadFlagsExitCode;
  }
  const double interval = absl::GetFlag(FLAGS_interval_s);
  if (!(interval > 0) || absl::GetFlag(FLAGS_count) < 0) {
    std::fprintf(stderr,
                 "bnps_status: --interval_s must be positive and --count >= 0\n");
    return bnps::util::kBadFlagsExitCode;
  }
  if (absl::GetFlag(FLAGS_watch) && absl::GetFlag(FLAGS_json)) {
    std::fprintf(stderr, "bnps_status: --watch and --json do not go together\n");
    return bnps::util::kBadFlagsExitCode;
  }
  absl::StatusOr<bnps::security::ClientSecurity> security =
      bnps::security::SecurityFromFlags();
  if (!security.ok()) {
    std::fprintf(stderr, "bnps_status: %s\n",
                 std::string(security.status().message()).c_str());
    return bnps::util::kBadFlagsExitCode;
  }
  bnps::client::JobReaderOptions reader_options;
  reader_options.servers = servers;
  reader_options.job = absl::GetFlag(FLAGS_job);
  reader_options.credentials = security->credentials;
  reader_options.token = security->token;
  reader_options.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  absl::StatusOr<std::unique_ptr<bnps::client::JobReader>> made =
      bnps::client::JobReader::Create(reader_options);
  if (!made.ok()) {
    std::fprintf(stderr, "bnps_status: %s\n",
                 std::string(made.status().message()).c_str());
    return bnps::util::kBadFlagsExitCode;
  }
  const bnps::client::JobReader& reader = **made;
  if (!absl::GetFlag(FLAGS_export).empty()) {
    return Export(reader, absl::GetFlag(FLAGS_export));
  }
  if (absl::GetFlag(FLAGS_digest)) return PrintDigest(reader);
  const auto all_answered = [](const std::vector<bnps::tools::ShardAnswer>& a) {
    for (const auto& x : a) {
      if (!x.status.has_value()) return false;
    }
    return true;
  };
  if (!absl::GetFlag(FLAGS_watch)) {
    const std::vector<bnps::tools::ShardAnswer> answers =
        Query(reader);
    const std::string out = absl::GetFlag(FLAGS_json)
                                ? bnps::tools::FormatJson(answers)
                                : bnps::tools::FormatText(answers);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return all_answered(answers) ? 0 : 1;
  }
  // --watch: redraw from the top-left corner, clearing what is left below.
  const bool tty = isatty(STDOUT_FILENO);
  bool ok = true;
  for (int n = 0; absl::GetFlag(FLAGS_count) == 0 || n < absl::GetFlag(FLAGS_count);
       ++n) {
    if (n > 0) absl::SleepFor(absl::Seconds(interval));
    const std::vector<bnps::tools::ShardAnswer> answers =
        Query(reader);
    ok = all_answered(answers);
    std::string frame = tty ? "\x1b[H\x1b[2J" : "";
    frame += absl::FormatTime("bnps_status %H:%M:%S", absl::Now(),
                              absl::LocalTimeZone());
    frame += " (every " + absl::StrCat(interval) + "s; Ctrl-C stops)\n";
    frame += bnps::tools::FormatText(answers);
    if (!tty) frame += "\n";
    std::fwrite(frame.data(), 1, frame.size(), stdout);
    std::fflush(stdout);
  }
  return ok ? 0 : 1;
}
