// LogLimiter: at most `per_second` lines a second of one kind (refusals of
// bad or unauthenticated calls), so that a client looping on a refused call
// cannot flood the log; the lines left out are counted and said with the
// next line let through.
//
// Example:
//   int64_t left_out = 0;
//   if (limiter.Admit(absl::Now(), &left_out)) {
//     std::fprintf(stderr, "rejected: %s%s\n", why.c_str(),
//                  LogLimiter::LeftOut(left_out).c_str());
//   }
//
// Thread-safety: thread-safe.

#ifndef BNPS_UTIL_LOG_LIMITER_H_
#define BNPS_UTIL_LOG_LIMITER_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace bnps::util {

class LogLimiter {
 public:
  explicit LogLimiter(int per_second = 10) : per_second_(per_second) {}

  // Whether a line may be written at `now`; if so, `*left_out` gets the
  // lines refused since the last one let through.
  bool Admit(absl::Time now, int64_t* left_out) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (now - window_start_ >= absl::Seconds(1)) {
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= per_second_) {
      ++left_out_;
      return false;
    }
    ++in_window_;
    *left_out = left_out_;
    left_out_ = 0;
    return true;
  }

  // " (N similar lines left out)" for N > 0, else "".
  static std::string LeftOut(int64_t n) {
    return n > 0 ? absl::StrCat(" (", n, " similar lines left out)") : "";
  }

 private:
  const int per_second_;
  absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int in_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t left_out_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace bnps::util

#endif  // BNPS_UTIL_LOG_LIMITER_H_
