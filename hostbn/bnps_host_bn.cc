// bnps_host_bn: a host's BN aggregator (hostbn/aggregator.h). Run one per
// host; start the host's workers with --bn_host_aggregator=ADDRESS:PORT.
// Their BN traffic then crosses to each shard as one frame per layer,
// phase and step for all of them, with the same results.
//
//   bnps_host_bn --host=10.0.0.5 --port=7200 --workers=4 [--token_file=F]

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "hostbn/host_bn_main.h"
#include "hostbn/host_bn_options.h"
#include "util/command_line.h"

int main(int argc, char** argv) {
  bnps::util::ParseCommandLine(
      argc, argv,
      "A host's BN aggregator: the BN traffic of the host's workers "
      "(bnps_worker --bn_host_aggregator) crosses to each shard as one frame "
      "per layer, phase and step.\n  usage: bnps_host_bn --host=ADDRESS "
      "--port=PORT --workers=K [--token_file=FILE]");
  absl::StatusOr<bnps::hostbn::HostBnOptions> options =
      bnps::hostbn::HostBnOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "bnps_host_bn: %s\n",
                 std::string(options.status().message()).c_str());
    return bnps::util::kBadFlagsExitCode;
  }
  return bnps::hostbn::RunHostBn(*options);
}
