// The body of bnps_host_bn: starts a host's BN Aggregator
// (hostbn/aggregator.h) with HostBnOptions (hostbn/host_bn_options.h), with
// its metrics, and serves until SIGTERM or SIGINT.
//
// Thread-safety: from main, before any other thread starts (it blocks
// SIGTERM and SIGINT for the threads it starts).

#ifndef BNPS_HOSTBN_HOST_BN_MAIN_H_
#define BNPS_HOSTBN_HOST_BN_MAIN_H_

#include "hostbn/host_bn_options.h"

namespace bnps::hostbn {

// Serves until SIGTERM or SIGINT, then stops. Errors are one line on
// stderr. Returns the process's exit status: 0 after a signal; 2 for
// options the aggregator or the metrics endpoint refuse (INVALID_ARGUMENT);
// 1 when either cannot start otherwise (an address in use).
int RunHostBn(const HostBnOptions& options);

}  // namespace bnps::hostbn

#endif  // BNPS_HOSTBN_HOST_BN_MAIN_H_
