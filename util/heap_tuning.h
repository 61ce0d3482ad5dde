// How a process's heap (glibc malloc) hands freed memory back to the kernel.
//
// By default glibc returns freed memory at the top of a heap to the kernel as
// soon as more than a few hundred kilobytes (a threshold that adapts) are free
// there, and serves large blocks with pages of their own that go back to the
// kernel when freed. Bulk transfers allocate and free megabytes per message
// (gRPC's read buffers, chunks being staged), so each step then takes the same
// memory from the kernel again: a page fault and a page of zeros for every 4
// KiB moved. With a 64 MB push + pull that was about 10,000 faults and a fifth
// of the process's CPU time (docs/performance.md). KeepFreedHeap keeps that
// memory in the process for reuse instead.
//
// The settings are process-wide (glibc's mallopt): binaries apply them once,
// from main, through util/heap_flags.h; libraries never do.
//
// Thread-safety: call before other threads start.

#ifndef BNPS_UTIL_HEAP_TUNING_H_
#define BNPS_UTIL_HEAP_TUNING_H_

#include <cstdint>

#include "absl/status/status.h"

namespace bnps::util {

// The largest block glibc serves from a heap rather than with pages of its
// own (glibc refuses larger values of M_MMAP_THRESHOLD on 64-bit).
inline constexpr int64_t kMaxHeapBlockBytes = int64_t{32} << 20;

// Keeps up to `keep_bytes` of freed memory at the top of each heap instead
// of returning it to the kernel (M_TRIM_THRESHOLD), and serves blocks of up
// to min(keep_bytes, kMaxHeapBlockBytes) from the heap, so that their memory
// is reused once freed (M_MMAP_THRESHOLD). Both thresholds then stay fixed
// (glibc's adaptation is off). 0 changes nothing: glibc's defaults, or
// whatever GLIBC_TUNABLES set; so does a build with AddressSanitizer, whose
// allocator has its own policy. INVALID_ARGUMENT if keep_bytes is negative,
// INTERNAL if malloc refuses a setting.
absl::Status KeepFreedHeap(int64_t keep_bytes);

}  // namespace bnps::util

#endif  // BNPS_UTIL_HEAP_TUNING_H_
