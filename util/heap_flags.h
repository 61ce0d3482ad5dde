// The flag of every bnps binary that moves bulk data (bnps_server,
// bnps_worker, ps_benchmark): --heap_keep_mb, how much freed memory the
// process keeps for reuse (util/heap_tuning.h). Linking this library defines
// it; ApplyHeapFlag applies it once the command line is parsed.
//
// Example:
//   util::ParseCommandLine(argc, argv, "usage ...");  // util/command_line.h
//   if (absl::Status s = util::ApplyHeapFlag(); !s.ok()) ...  // a bad value
//
// Thread-safety: call ApplyHeapFlag from main, before other threads start.

#ifndef BNPS_UTIL_HEAP_FLAGS_H_
#define BNPS_UTIL_HEAP_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace bnps::util {

// The flag's value in MB.
int64_t HeapKeepMbFlag();

// "--heap_keep_mb=N" with the flag's value, to give a child process of the
// same binary the same setting.
std::string HeapFlagArgument();

// KeepFreedHeap of the flag's bytes; INVALID_ARGUMENT naming the flag for a
// negative value.
absl::Status ApplyHeapFlag();

}  // namespace bnps::util

#endif  // BNPS_UTIL_HEAP_FLAGS_H_
