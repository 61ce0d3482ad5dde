// What bnps_host_bn runs, from its command line: the flags of the binary
// (defined in host_bn_options.cc, with the metrics flags of
// metrics/metrics_flags.h) turned into the Aggregator's options
// (hostbn/aggregator.h), checked once.
//
// Example (hostbn/bnps_host_bn.cc):
//   absl::StatusOr<HostBnOptions> options = HostBnOptionsFromFlags();
//   if (!options.ok()) ...          // one line naming the flag; exit 2
//   return RunHostBn(*options);     // hostbn/host_bn_main.h
//
// Thread-safety: HostBnOptionsFromFlags reads the process's flags; call it
// after the command line is parsed.

#ifndef BNPS_HOSTBN_HOST_BN_OPTIONS_H_
#define BNPS_HOSTBN_HOST_BN_OPTIONS_H_

#include "absl/status/statusor.h"
#include "hostbn/aggregator.h"

namespace bnps::hostbn {

// Everything bnps_host_bn needs from its flags.
struct HostBnOptions {
  // --host, --port, --workers, --token_file (the token read),
  // --per_worker_tokens, --num_workers, --shards (empty names dropped).
  // metrics is unset: RunHostBn sets it.
  Aggregator::Options aggregator;
};

// The options the flags describe. The error of the file for an unreadable
// or invalid --token_file; INVALID_ARGUMENT naming --metrics_port when it
// is not a port. The Aggregator checks the rest when it starts.
absl::StatusOr<HostBnOptions> HostBnOptionsFromFlags();

}  // namespace bnps::hostbn

#endif  // BNPS_HOSTBN_HOST_BN_OPTIONS_H_
