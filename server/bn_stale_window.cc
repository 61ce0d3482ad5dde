#include "server/bn_stale_window.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace bnps::server {

StaleWindow::StaleWindow(int num_workers, int64_t staleness, int64_t channels,
                         std::vector<int> group)
    : num_workers_(num_workers),
      staleness_(staleness),
      channels_(channels),
      group_(std::move(group)),
      first_step_(num_workers, -1),
      newest_step_(num_workers, -1) {}

void StaleWindow::Add(int worker, int64_t step, bn::Moments moments,
                      absl::Time deadline, Done done) {
  auto& slots = by_step_[step];
  if (slots.empty()) slots.resize(num_workers_);
  if (!slots[worker].has_value()) slots[worker] = std::move(moments);
  if (first_step_[worker] < 0 || step < first_step_[worker]) {
    first_step_[worker] = step;
  }
  newest_step_[worker] = std::max(newest_step_[worker], step);
  waiting_.push_back({worker, step, deadline, std::move(done)});
}

std::vector<int> StaleWindow::Missing(const Waiter& w,
                                      const std::vector<bool>& live) const {
  std::vector<int> missing;
  const int64_t target = w.step - staleness_;
  if (target < 0) return missing;
  auto it = by_step_.find(target);
  for (int o = 0; o < num_workers_; ++o) {
    if (o == w.worker || !live[o]) continue;
    if (it != by_step_.end() && it->second[o].has_value()) continue;
    // Its moments in this window begin after the target: it joined (or the
    // job restarted) later, and never sends the target's.
    if (first_step_[o] > target) continue;
    missing.push_back(o);
  }
  return missing;
}

StaleWindow::Answer StaleWindow::Merge(const Waiter& w,
                                       const std::vector<bool>& live) const {
  Answer a;
  a.others = bn::Moments::Empty(channels_);
  a.all = bn::Moments::Empty(channels_);
  const int64_t target = w.step - staleness_;
  const auto& own = by_step_.at(w.step)[w.worker];
  auto it = target < 0 ? by_step_.end() : by_step_.find(target);
  for (int o = 0; o < num_workers_; ++o) {
    if (o == w.worker) {
      bn::MergeInto(*own, &a.all);
      continue;
    }
    if (it == by_step_.end() || !live[o] || !it->second[o].has_value()) {
      continue;
    }
    if (group_.empty() || group_[o] == group_[w.worker]) {
      bn::MergeInto(*it->second[o], &a.others);
      ++a.contributors;
    }
    bn::MergeInto(*it->second[o], &a.all);
  }
  return a;
}

void StaleWindow::Evaluate(const std::vector<bool>& live,
                           const std::vector<absl::Status>& failed,
                           std::vector<std::function<void()>>* ready) {
  std::vector<Waiter> still;
  for (Waiter& w : waiting_) {
    const std::vector<int> missing = Missing(w, live);
    absl::Status why;
    for (int o : missing) {
      if (!failed[o].ok()) {
        why = absl::Status(failed[o].code(),
                           absl::StrCat("BN forward step ", w.step,
                                        " needs worker ", o, "'s moments of "
                                        "step ", w.step - staleness_, ": ",
                                        failed[o].message()));
        break;
      }
    }
    if (!why.ok()) {
      ready->push_back([done = std::move(w.done), why] { done(why); });
    } else if (missing.empty()) {
      ready->push_back(
          [done = std::move(w.done), a = Merge(w, live)]() mutable {
            done(std::move(a));
          });
    } else {
      still.push_back(std::move(w));
    }
  }
  waiting_ = std::move(still);
  Prune(live);
}

void StaleWindow::Expire(absl::Time now, const std::string& layer,
                         const std::vector<bool>& live,
                         std::vector<std::function<void()>>* ready) {
  std::vector<Waiter> still;
  for (Waiter& w : waiting_) {
    if (w.deadline > now) {
      still.push_back(std::move(w));
      continue;
    }
    const std::vector<int> missing = Missing(w, live);
    const absl::Status why = absl::DeadlineExceededError(absl::StrCat(
        "BN forward of layer '", layer, "' step ", w.step,
        " timed out waiting for the moments of step ", w.step - staleness_,
        " (--bn_staleness=", staleness_, ") of workers [",
        absl::StrJoin(missing, ", "), "]"));
    ready->push_back([done = std::move(w.done), why] { done(why); });
  }
  waiting_ = std::move(still);
}

void StaleWindow::FailAll(const absl::Status& why,
                          std::vector<std::function<void()>>* ready) {
  for (Waiter& w : waiting_) {
    ready->push_back([done = std::move(w.done), why] { done(why); });
  }
  waiting_.clear();
}

void StaleWindow::Prune(const std::vector<bool>& live) {
  // A forward still to come is of a live worker's newest step or later; a
  // waiting one of its own step. Either needs steps from its step - s on.
  int64_t keep_from = -1;
  bool any = false;
  for (int o = 0; o < num_workers_; ++o) {
    if (!live[o] || newest_step_[o] < 0) continue;
    keep_from = any ? std::min(keep_from, newest_step_[o]) : newest_step_[o];
    any = true;
  }
  for (const Waiter& w : waiting_) keep_from = std::min(keep_from, w.step);
  if (!any) return;
  keep_from -= staleness_;
  while (!by_step_.empty() && by_step_.begin()->first < keep_from) {
    by_step_.erase(by_step_.begin());
  }
}

}  // namespace bnps::server
