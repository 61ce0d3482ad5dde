#include "util/heap_tuning.h"

#include <malloc.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace bnps::util {
namespace {

// AddressSanitizer brings its own allocator, which ignores mallopt.
#ifdef __SANITIZE_ADDRESS__
constexpr bool kSanitizerHeap = true;
#else
constexpr bool kSanitizerHeap = false;
#endif

}  // namespace

absl::Status KeepFreedHeap(int64_t keep_bytes) {
  if (keep_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("heap: cannot keep ", keep_bytes, " bytes"));
  }
  if (keep_bytes == 0 || kSanitizerHeap) return absl::OkStatus();
  // mallopt takes an int.
  const int trim = static_cast<int>(std::min<int64_t>(
      keep_bytes, std::numeric_limits<int>::max()));
  const int block =
      static_cast<int>(std::min<int64_t>(keep_bytes, kMaxHeapBlockBytes));
  if (mallopt(M_TRIM_THRESHOLD, trim) != 1) {
    return absl::InternalError(
        absl::StrCat("heap: malloc refused a trim threshold of ", trim));
  }
  if (mallopt(M_MMAP_THRESHOLD, block) != 1) {
    return absl::InternalError(
        absl::StrCat("heap: malloc refused an mmap threshold of ", block));
  }
  return absl::OkStatus();
}

}  // namespace bnps::util
