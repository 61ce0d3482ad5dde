#include "util/fd_limit.h"

#include <errno.h>
#include <string.h>
#include <sys/resource.h>

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace bnps::util {
namespace {

int64_t AsInt(rlim_t v) {
  if (v == RLIM_INFINITY ||
      v > static_cast<rlim_t>(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return static_cast<int64_t>(v);
}

}  // namespace

int64_t OpenFileLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 1024;  // the usual default
  return AsInt(r.rlim_cur);
}

absl::StatusOr<int64_t> RaiseOpenFileLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) {
    return absl::UnavailableError(
        absl::StrCat("getrlimit(RLIMIT_NOFILE): ", strerror(errno)));
  }
  if (r.rlim_cur != r.rlim_max) {
    rlimit raised = r;
    raised.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0) {
      return absl::UnavailableError(absl::StrCat(
          "setrlimit(RLIMIT_NOFILE) to ", AsInt(r.rlim_max), ": ",
          strerror(errno)));
    }
  }
  return OpenFileLimit();
}

}  // namespace bnps::util
