#include "util/heap_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "util/heap_tuning.h"

ABSL_FLAG(int64_t, heap_keep_mb, 256,
          "Freed memory (MB) each heap of the process keeps for reuse instead "
          "of returning it to the kernel at once; blocks of up to "
          "min(this, 32 MB) come from the heap. Saves a page fault per 4 KiB "
          "that bulk transfers move. 0: glibc's defaults (or GLIBC_TUNABLES).");

namespace bnps::util {

int64_t HeapKeepMbFlag() { return absl::GetFlag(FLAGS_heap_keep_mb); }

std::string HeapFlagArgument() {
  return absl::StrCat("--heap_keep_mb=", HeapKeepMbFlag());
}

absl::Status ApplyHeapFlag() {
  const int64_t mb = absl::GetFlag(FLAGS_heap_keep_mb);
  if (mb < 0 || mb > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heap_keep_mb=", mb, " must be in [0, 2^30]"));
  }
  return KeepFreedHeap(mb << 20);
}

}  // namespace bnps::util
