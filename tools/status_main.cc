#include "tools/status_main.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/job_reader.h"
#include "client/state_export.h"
#include "proto/bnps.pb.h"
#include "tools/status_view.h"
#include "util/command_line.h"

namespace bnps::tools {
namespace {

// Every shard's status, or why it did not answer.
std::vector<ShardAnswer> Query(const client::JobReader& reader) {
  std::vector<ShardAnswer> answers(reader.num_shards());
  for (int i = 0; i < reader.num_shards(); ++i) {
    answers[i].address = reader.options().servers[i];
    absl::StatusOr<proto::StatusResponse> s = reader.GetStatus(i);
    if (s.ok()) {
      answers[i].status = *std::move(s);
    } else {
      answers[i].error = std::string(s.status().message());
    }
  }
  return answers;
}

// Prints the --digest line; 1 if a server did not answer.
int PrintDigest(const client::JobReader& reader) {
  absl::StatusOr<client::JobDigest> d = reader.GetDigest();
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
int Export(const client::JobReader& reader, const std::string& path) {
  absl::StatusOr<client::JobState> state = reader.ReadState();
  absl::Status s = state.status();
  if (s.ok()) s = client::WriteExport(*state, path);
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

bool AllAnswered(const std::vector<ShardAnswer>& answers) {
  for (const ShardAnswer& a : answers) {
    if (!a.status.has_value()) return false;
  }
  return true;
}

// --watch: redraws the view from the top-left corner, clearing what is left
// below; 0 if every server answered the last time, else 1.
int Watch(const client::JobReader& reader, const StatusOptions& o) {
  const bool tty = isatty(STDOUT_FILENO);
  bool ok = true;
  for (int n = 0; o.count == 0 || n < o.count; ++n) {
    if (n > 0) absl::SleepFor(absl::Seconds(o.interval_s));
    const std::vector<ShardAnswer> answers = Query(reader);
    ok = AllAnswered(answers);
    std::string frame = tty ? "\x1b[H\x1b[2J" : "";
    frame += absl::FormatTime("bnps_status %H:%M:%S", absl::Now(),
                              absl::LocalTimeZone());
    frame += " (every " + absl::StrCat(o.interval_s) + "s; Ctrl-C stops)\n";
    frame += FormatText(answers);
    if (!tty) frame += "\n";
    std::fwrite(frame.data(), 1, frame.size(), stdout);
    std::fflush(stdout);
  }
  return ok ? 0 : 1;
}

}  // namespace

int RunStatus(const StatusOptions& o) {
  absl::StatusOr<std::unique_ptr<client::JobReader>> made =
      client::JobReader::Create(o.reader);
  if (!made.ok()) {
    std::fprintf(stderr, "bnps_status: %s\n",
                 std::string(made.status().message()).c_str());
    return util::kBadFlagsExitCode;
  }
  const client::JobReader& reader = **made;
  if (!o.export_path.empty()) return Export(reader, o.export_path);
  if (o.digest) return PrintDigest(reader);
  if (o.watch) return Watch(reader, o);
  const std::vector<ShardAnswer> answers = Query(reader);
  const std::string out = o.json ? FormatJson(answers) : FormatText(answers);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return AllAnswered(answers) ? 0 : 1;
}

}  // namespace bnps::tools
