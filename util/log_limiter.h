// LogLimiter: a burst of `burst` lines of one kind (refusals of bad or
// unauthenticated calls), then at most `per_second` a second, so that a
// client looping on a refused call cannot flood the log while a few
// refusals are all written; the lines left out are counted and said with
// the next line let through. (A token bucket.)
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

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace bnps::util {

class LogLimiter {
 public:
  explicit LogLimiter(int burst = 100, double per_second = 5)
      : burst_(burst), per_second_(per_second), tokens_(burst) {}

  // Whether a line may be written at `now`; if so, `*left_out` gets the
  // lines refused since the last one let through.
  bool Admit(absl::Time now, int64_t* left_out) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (last_ != absl::InfinitePast() && now > last_) {
      tokens_ = std::min<double>(
          burst_, tokens_ + per_second_ * absl::ToDoubleSeconds(now - last_));
    }
    last_ = std::max(last_, now);
    if (tokens_ < 1) {
      ++left_out_;
      return false;
    }
    tokens_ -= 1;
    *left_out = left_out_;
    left_out_ = 0;
    return true;
  }

  // " (N similar lines left out)" for N > 0, else "".
  static std::string LeftOut(int64_t n) {
    return n > 0 ? absl::StrCat(" (", n, " similar lines left out)") : "";
  }

 private:
  const int burst_;
  const double per_second_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t left_out_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace bnps::util

#endif  // BNPS_UTIL_LOG_LIMITER_H_
