// The process's limit on open descriptors (RLIMIT_NOFILE), read and raised.
// A server raises its soft limit to the hard one when it starts (the usual
// soft limit of 1,024 is a default for shells, not a choice of the
// administrator, who sets the hard one) and sizes its connection caps from
// what it got, so that a flood of connections is refused before the table
// fills and the gRPC listener can always accept.
//
// Thread-safety: plain functions; the limit is process-wide state, so call
// RaiseOpenFileLimit once, from main, before threads open files.

#ifndef BNPS_UTIL_FD_LIMIT_H_
#define BNPS_UTIL_FD_LIMIT_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace bnps::util {

// The soft RLIMIT_NOFILE now (RLIM_INFINITY as INT64_MAX).
int64_t OpenFileLimit();

// Raises the soft RLIMIT_NOFILE to the hard one and returns the soft limit
// it then has. UNAVAILABLE (with the reason) if the kernel refuses; the
// limit is then unchanged.
absl::StatusOr<int64_t> RaiseOpenFileLimit();

}  // namespace bnps::util

#endif  // BNPS_UTIL_FD_LIMIT_H_
