// bnps_status: shows what every shard server of a job knows.
//
//   bnps_status --servers=127.0.0.1:7000,127.0.0.1:7001

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "proto/bnps.grpc.pb.h"
#include "security/job_token.h"
#include "security/security_flags.h"
#include "util/command_line.h"
#include "util/sha256.h"

ABSL_FLAG(std::string, servers, "127.0.0.1:7000",
          "Comma-separated host:port of the shard servers, shard 0 first.");
ABSL_FLAG(int, timeout_ms, 3000, "Deadline of each status call.");
ABSL_FLAG(bool, digest, false,
          "Print only one line, `params sha256 <hex> step <n>`: a SHA-256 over "
          "every shard's parameters and BN running statistics in key order "
          "(bit-identical runs give the same line), and the smallest "
          "parameter version of the shards.");

namespace {

// The --digest line, or 1 if a server did not answer.
int PrintDigest(const std::vector<std::string>& servers,
                const bnps::security::ClientSecurity& security) {
  std::map<std::string, std::string> entries;  // key -> its SHA-256
  int64_t step = INT64_MAX;
  for (const std::string& server : servers) {
    auto stub = bnps::proto::ParameterServer::NewStub(
        grpc::CreateChannel(server, security.credentials));
    grpc::ClientContext ctx;
    if (!security.token.empty()) {
      ctx.AddMetadata(std::string(bnps::security::kTokenMetadataKey),
                      security.token);
    }
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
    bnps::proto::DigestResponse resp;
    const grpc::Status s =
        stub->GetDigest(&ctx, bnps::proto::DigestRequest(), &resp);
    if (!s.ok()) {
      std::fprintf(stderr, "bnps_status: %s: no digest (%s)\n", server.c_str(),
                   s.error_message().c_str());
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
  // --help exits 0; an unknown or malformed flag exits 2.
  bnps::util::ParseCommandLine(
      argc, argv,
      "Shows the job configuration, the workers' liveness and clocks, and the "
      "parameter versions of every shard server.\n"
      "  bnps_status --servers=127.0.0.1:7000,127.0.0.1:7001\n"
      "Exit status: 0 when every server answered or after --help; 1 when one "
      "did not; 2 for bad flags.");
  const std::vector<std::string> servers =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  if (servers.empty()) {
    std::fprintf(stderr, "bnps_status: --servers is empty\n");
    return bnps::util::kBadFlagsExitCode;
  }
  absl::StatusOr<bnps::security::ClientSecurity> security =
      bnps::security::SecurityFromFlags();
  if (!security.ok()) {
    std::fprintf(stderr, "bnps_status: %s\n",
                 std::string(security.status().message()).c_str());
    return bnps::util::kBadFlagsExitCode;
  }
  if (absl::GetFlag(FLAGS_digest)) return PrintDigest(servers, *security);
  int unreachable = 0;
  for (size_t i = 0; i < servers.size(); ++i) {
    auto stub = bnps::proto::ParameterServer::NewStub(
        grpc::CreateChannel(servers[i], security->credentials));
    grpc::ClientContext ctx;
    if (!security->token.empty()) {
      ctx.AddMetadata(std::string(bnps::security::kTokenMetadataKey),
                      security->token);
    }
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
    bnps::proto::StatusRequest req;
    bnps::proto::StatusResponse resp;
    const grpc::Status s = stub->GetStatus(&ctx, req, &resp);
    if (!s.ok()) {
      std::printf("%s: unreachable (%s)\n", servers[i].c_str(),
                  s.error_message().c_str());
      ++unreachable;
      continue;
    }
    const bnps::proto::JobConfig& c = resp.config();
    std::printf(
        "%s: job '%s' shard %d/%d, policy %s, staleness %ld, %d workers, "
        "worker loss: %s\n",
        servers[i].c_str(), c.job().c_str(), c.shard(), c.num_shards(),
        bnps::proto::Policy_Name(c.policy()).c_str(),
        static_cast<long>(c.staleness()), c.num_workers(),
        bnps::proto::WorkerLossAction_Name(c.worker_loss()).c_str());
    std::printf("  parameters %d (min version %ld), BN layers %d, pushes %ld "
                "applied, %ld duplicate\n",
                resp.num_parameters(), static_cast<long>(resp.min_version()),
                resp.num_bn_layers(), static_cast<long>(resp.pushes_applied()),
                static_cast<long>(resp.pushes_duplicate()));
    if (!resp.checkpoint_dir().empty() || resp.generation() > 0) {
      std::printf("  generation %ld%s, checkpoints in '%s': %d, restored step %ld\n",
                  static_cast<long>(resp.generation()),
                  resp.needs_rollback() ? " (needs a rollback)" : "",
                  resp.checkpoint_dir().c_str(), resp.checkpoint_steps_size(),
                  static_cast<long>(resp.restored_step()));
    }
    for (const bnps::proto::WorkerStatus& w : resp.workers()) {
      std::printf("  worker %d: %s", w.worker(),
                  !w.registered() ? "not registered"
                  : w.live()      ? "live"
                                  : "LOST");
      if (w.registered()) {
        std::printf(", last heard %ld ms ago", static_cast<long>(w.ms_since_heartbeat()));
      }
      if (w.clock() >= 0) std::printf(", clock %ld", static_cast<long>(w.clock()));
      std::printf("\n");
    }
  }
  return unreachable == 0 ? 0 : 1;
}
