// bnps_status: shows what every shard server of a job knows, once, as JSON,
// or as a live view.
//
//   bnps_status --servers=127.0.0.1:7000,127.0.0.1:7001
//   bnps_status --servers=... --watch --interval_s=2
//   bnps_status --servers=... --json

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "proto/bnps.grpc.pb.h"
#include "security/job_token.h"
#include "security/security_flags.h"
#include "tools/status_view.h"
#include "util/command_line.h"
#include "util/sha256.h"

ABSL_FLAG(std::string, servers, "127.0.0.1:7000",
          "Comma-separated host:port of the shard servers, shard 0 first.");
ABSL_FLAG(int, timeout_ms, 3000, "Deadline of each status call.");
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
ABSL_FLAG(bool, digest, false,
          "Print only one line, `params sha256 <hex> step <n>`: a SHA-256 over "
          "every shard's parameters and BN running statistics in key order "
          "(bit-identical runs give the same line), and the smallest "
          "parameter version of the shards.");

namespace {

// A context with the job token and --timeout_ms's deadline.
void Prepare(const bnps::security::ClientSecurity& security,
             grpc::ClientContext* ctx) {
  if (!security.token.empty()) {
    ctx->AddMetadata(std::string(bnps::security::kTokenMetadataKey),
                     security.token);
  }
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
}

std::vector<bnps::tools::ShardAnswer> Query(
    const std::vector<std::string>& servers,
    const std::vector<std::unique_ptr<bnps::proto::ParameterServer::Stub>>& stubs,
    const bnps::security::ClientSecurity& security) {
  std::vector<bnps::tools::ShardAnswer> answers(servers.size());
  for (size_t i = 0; i < servers.size(); ++i) {
    answers[i].address = servers[i];
    grpc::ClientContext ctx;
    Prepare(security, &ctx);
    bnps::proto::StatusRequest req;
    bnps::proto::StatusResponse resp;
    const grpc::Status s = stubs[i]->GetStatus(&ctx, req, &resp);
    if (s.ok()) {
      answers[i].status = std::move(resp);
    } else {
      answers[i].error = s.error_message();
    }
  }
  return answers;
}

// Prints the --digest line; 1 if a server did not answer.
int PrintDigest(
    const std::vector<std::string>& servers,
    const std::vector<std::unique_ptr<bnps::proto::ParameterServer::Stub>>& stubs,
    const bnps::security::ClientSecurity& security) {
  std::map<std::string, std::string> entries;  // key -> its SHA-256
  int64_t step = INT64_MAX;
  for (size_t i = 0; i < servers.size(); ++i) {
    grpc::ClientContext ctx;
    Prepare(security, &ctx);
    bnps::proto::DigestResponse resp;
    const grpc::Status s =
        stubs[i]->GetDigest(&ctx, bnps::proto::DigestRequest(), &resp);
    if (!s.ok()) {
      std::fprintf(stderr, "bnps_status: %s: no digest (%s)\n",
                   servers[i].c_str(), s.error_message().c_str());
      return 1;
    }
    for (const auto& e : resp.entries()) entries[e.key()] = e.sha256();
    step = std::min<int64_t>(step, resp.step());
  }
  bnps::util::Sha256 h;
  for (const auto& [key, hash] : entries) {
    h.Update(key);
    h.Update(absl::string_view("\0", 1));
    h.Update(hash);
  }
  std::printf("params sha256 %s step %lld\n", bnps::util::Hex(h.Final()).c_str(),
              static_cast<long long>(step == INT64_MAX ? 0 : step));
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
      "(--watch).\n"
      "  bnps_status --servers=127.0.0.1:7000,127.0.0.1:7001 [--watch]\n"
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
  std::vector<std::unique_ptr<bnps::proto::ParameterServer::Stub>> stubs;
  for (const std::string& server : servers) {
    stubs.push_back(bnps::proto::ParameterServer::NewStub(
        grpc::CreateChannel(server, security->credentials != nullptr
                                        ? security->credentials
                                        : grpc::InsecureChannelCredentials())));
  }
  if (absl::GetFlag(FLAGS_digest)) return PrintDigest(servers, stubs, *security);
  const auto all_answered = [](const std::vector<bnps::tools::ShardAnswer>& a) {
    for (const auto& x : a) {
      if (!x.status.has_value()) return false;
    }
    return true;
  };
  if (!absl::GetFlag(FLAGS_watch)) {
    const std::vector<bnps::tools::ShardAnswer> answers =
        Query(servers, stubs, *security);
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
        Query(servers, stubs, *security);
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
