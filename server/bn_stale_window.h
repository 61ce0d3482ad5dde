// The exact-staleness mode of async BN (--bn_staleness=s): a worker at step
// t normalizes with merge(its own moments of step t, the other live
// workers' moments of step t - s) -- the others' exactly s steps old,
// whatever the workers' speeds -- and with its own alone while t < s. A
// worker that is ahead waits for the others to reach step t - s; a worker
// whose first moments in this window are of a later step (it joined, or
// the job restarted, after t - s) is not waited for.
//
// With BN groups (--bn_group_size) a worker's answer merges its own group's
// others only, while the running statistics' merge (Answer::all) holds
// every group's, as without groups; a forward still waits for every live
// worker's moments of t - s, so that merge is the job's whatever the
// speeds.
//
// StaleWindow is one layer's record of the workers' moments by step and
// the forward passes waiting for them. It keeps only the steps some
// waiting or future forward can still need: from (the slowest live
// worker's newest step) - s on.
//
// Thread-safety: none; the aggregator calls it under its lock.

#ifndef BNPS_SERVER_BN_STALE_WINDOW_H_
#define BNPS_SERVER_BN_STALE_WINDOW_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bn/moments.h"

namespace bnps::server {

class StaleWindow {
 public:
  struct Answer {
    // The others' moments of step t - s (of the asker's group), in worker
    // order.
    bn::Moments others;
    int contributors = 0;  // workers merged into `others`
    // Own (step t) and every group's others: for the running stats.
    bn::Moments all;
  };
  using Done = std::function<void(absl::StatusOr<Answer>)>;

  // `group`: each worker's BN group (policy::BnGroupOfWorkers; empty: one
  // group, the job). REQUIRES: num_workers >= 1, staleness >= 0,
  // channels >= 1, group empty or of num_workers entries.
  StaleWindow(int num_workers, int64_t staleness, int64_t channels,
              std::vector<int> group = {});

  // Records `worker`'s moments of `step` (a repeat of a step keeps the
  // first) and queues its answer, `done` once the others' moments of step
  // - s are in (or it fails, or `deadline` passes: Expire). REQUIRES:
  // worker in range; moments of the layer's channel count.
  void Add(int worker, int64_t step, bn::Moments moments, absl::Time deadline,
           Done done);

  // Answers (or fails) every waiting forward that can be, given which
  // workers are live and which failed (failed[w] not OK: a forward that
  // needs w fails with its status); the callbacks go to `ready`, to be run
  // without the caller's lock. Prunes steps no forward can need any more.
  void Evaluate(const std::vector<bool>& live,
                const std::vector<absl::Status>& failed,
                std::vector<std::function<void()>>* ready);

  // Fails the forwards whose deadline is at or before `now`, naming the
  // workers they wait for (given which are live).
  void Expire(absl::Time now, const std::string& layer,
              const std::vector<bool>& live,
              std::vector<std::function<void()>>* ready);

  // Fails every waiting forward with `why` (the state was replaced).
  void FailAll(const absl::Status& why,
               std::vector<std::function<void()>>* ready);

  // Replaces the groups (BnAggregator::SetGroups); answers from then on
  // follow them. REQUIRES: as the constructor's `group`.
  void set_group(std::vector<int> group) { group_ = std::move(group); }

  // Forwards waiting, and steps kept (for tests and metrics).
  int waiting() const { return static_cast<int>(waiting_.size()); }
  int steps_kept() const { return static_cast<int>(by_step_.size()); }

 private:
  struct Waiter {
    int worker;
    int64_t step;
    absl::Time deadline;
    Done done;
  };
  // The workers `w` at `step` still waits for (empty: it can be answered).
  std::vector<int> Missing(const Waiter& w,
                           const std::vector<bool>& live) const;
  Answer Merge(const Waiter& w, const std::vector<bool>& live) const;
  void Prune(const std::vector<bool>& live);

  const int num_workers_;
  const int64_t staleness_;
  const int64_t channels_;
  std::vector<int> group_;  // by worker; empty: one group
  // step -> each worker's moments of it.
  std::map<int64_t, std::vector<std::optional<bn::Moments>>> by_step_;
  std::vector<int64_t> first_step_;   // by worker; -1: none yet
  std::vector<int64_t> newest_step_;  // by worker; -1: none yet
  std::vector<Waiter> waiting_;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_BN_STALE_WINDOW_H_
