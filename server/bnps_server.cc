// bnps_server: one shard server of a bnps job.
//
//   bnps_server --port=7000 --shard=0 --num_shards=2 --num_workers=4 --policy=sync

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "server/server_main.h"
#include "server/server_options.h"
#include "util/command_line.h"

int main(int argc, char** argv) {
  // --help exits 0; an unknown or malformed flag exits 2. Flags may come
  // from BNPS_* variables; BNPS_SHARD=from-hostname takes a StatefulSet pod's
  // ordinal.
  bnps::util::EnvFlagsOptions env;
  env.ordinal_flag = "shard";
  bnps::util::ParseCommandLine(
      argc, argv,
      "A shard server of a bnps job: keeps the parameters it owns, applies the "
      "optimizer, and merges BN statistics under --policy.\n"
      "  bnps_server --port=7000 --shard=0 --num_shards=2 --num_workers=4 "
      "--policy=sync\n"
      "The server exits 0 once every worker of the job finished and its "
      "final checkpoint is written, unless --keep_serving; restarted on a "
      "complete job, it serves the final state for reads until stopped.\n"
      "Exit status: 0 after the job completed or a clean shutdown (SIGINT, "
      "SIGTERM) or --help; 2 for a flag it cannot use; 1 for options that "
      "do not fit together, an address it cannot bind (a port in use), or a "
      "final checkpoint that could not be written.",
      env);
  absl::Status s = bnps::server::PrepareServerProcess();
  absl::StatusOr<bnps::server::ServerOptions> options =
      s.ok() ? bnps::server::ServerOptionsFromFlags() : s;
  if (!options.ok()) {
    std::fprintf(stderr, "bnps_server: %s\n",
                 std::string(options.status().message()).c_str());
    return bnps::util::kBadFlagsExitCode;
  }
  return bnps::server::RunServer(*options);
}
