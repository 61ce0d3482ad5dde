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

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "tools/status_main.h"
#include "tools/status_options.h"
#include "util/command_line.h"

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
  absl::StatusOr<bnps::tools::StatusOptions> options =
      bnps::tools::StatusOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "bnps_status: %s\n",
                 std::string(options.status().message()).c_str());
    return bnps::util::kBadFlagsExitCode;
  }
  return bnps::tools::RunStatus(*options);
}
