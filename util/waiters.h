// Answering waiters under a lock. The classes that answer later (pulls that
// wait for a version, steps that wait for the staleness bound) keep a list of
// waiters; while holding their lock they take out the ones whose answer is
// known, and call them after releasing it, so a callback may call back in.

#ifndef BNPS_UTIL_WAITERS_H_
#define BNPS_UTIL_WAITERS_H_

#include <functional>
#include <utility>
#include <vector>

namespace bnps::util {

// Callbacks collected under a lock, to run after it is released.
using ReadyCallbacks = std::vector<std::function<void()>>;

// Removes from `waiters` each one for which answer(w) returns a value (an
// std::optional), and appends to `ready` the call of its `done` member with
// that value. The others stay, in order.
template <typename Waiter, typename Answer>
void TakeAnswered(std::vector<Waiter>* waiters, Answer answer,
                  ReadyCallbacks* ready) {
  std::vector<Waiter> still;
  for (Waiter& w : *waiters) {
    auto result = answer(static_cast<const Waiter&>(w));
    if (!result.has_value()) {
      still.push_back(std::move(w));
      continue;
    }
    ready->push_back(
        [done = std::move(w.done), r = *std::move(result)]() mutable {
          done(std::move(r));
        });
  }
  *waiters = std::move(still);
}

}  // namespace bnps::util

#endif  // BNPS_UTIL_WAITERS_H_
