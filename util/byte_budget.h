// ByteBudget: a count of bytes held against a fixed limit, shared by many
// holders (the BN connections of a server: their unread answers and partial
// frames), so that together they never hold more than the limit. A holder
// charges before it holds and releases what it let go; a charge that does
// not fit is refused whole (TryCharge) or cut to what fits (ChargeUpTo), and
// the caller sheds or refuses the work.
//
// Example:
//   if (!budget->TryCharge(answer.size())) return Shed();
//   queue.append(answer);
//   ...
//   budget->Release(written);
//
// Thread-safety: thread-safe (lock-free); used() never exceeds limit().

#ifndef BNPS_UTIL_BYTE_BUDGET_H_
#define BNPS_UTIL_BYTE_BUDGET_H_

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace bnps::util {

class ByteBudget {
 public:
  // REQUIRES: limit >= 0.
  explicit ByteBudget(int64_t limit) : limit_(limit) {}

  // Charges `n` (>= 0) if it fits in what is left; false, charging
  // nothing, if not.
  bool TryCharge(int64_t n) {
    int64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (n > limit_ - used) return false;
    } while (!used_.compare_exchange_weak(used, used + n,
                                          std::memory_order_relaxed));
    return true;
  }

  // Charges `n` (>= 0) for something lasting -- what clients make the
  // server keep (records, cached names), not answers in flight -- only if
  // at most half the limit is in use after it, so that the other half
  // always stays for answers in flight; false, charging nothing, if not.
  bool TryChargeLasting(int64_t n) {
    int64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (n > limit_ / 2 - used) return false;
    } while (!used_.compare_exchange_weak(used, used + n,
                                          std::memory_order_relaxed));
    return true;
  }

  // Charges as much of `n` (>= 0) as fits and returns that (0 when the
  // budget is spent).
  int64_t ChargeUpTo(int64_t n) {
    int64_t used = used_.load(std::memory_order_relaxed);
    int64_t got = 0;
    do {
      got = std::max<int64_t>(0, std::min(n, limit_ - used));
      if (got == 0) return 0;
    } while (!used_.compare_exchange_weak(used, used + got,
                                          std::memory_order_relaxed));
    return got;
  }

  // Gives back `n` bytes charged earlier.
  void Release(int64_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }

  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }
  // What a charge may take now (another holder may take it first).
  int64_t left() const { return limit_ - used(); }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

}  // namespace bnps::util

#endif  // BNPS_UTIL_BYTE_BUDGET_H_
