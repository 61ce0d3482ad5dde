// Co-located aggregation: several model replicas in one process (one per
// device, or per core) act as ONE worker towards the servers. Each replica's
// BN layers talk to their own member of the group; the group combines the
// replicas' contributions on the host and crosses the network once per layer
// and phase, then hands every replica the same answer.
//
//   HostBnGroup group(/*replicas=*/2, &server_exchange);
//   replica 0's model: SetBnExchange(group.member(0)); replica 1's: member(1)
//
// Forward merges the replicas' moments with Chan's formula in double, in
// replica order (0, 1, ...) whatever order the threads arrive in, so results
// are bitwise independent of scheduling; Backward adds the replicas' sums in
// replica order. The upstream exchange (the servers, or a LocalBnExchange to
// normalize with the host's batch) is called once per round, from the thread
// of the replica that completes the round, never concurrently.
//
// Every replica must call every layer in the same order (the model's). A
// replica that fails must call Abort, which ends the rounds in progress and
// every later one (until Reset), so no replica waits for it forever.
//
// Thread-safety: member(i) is used by replica i's thread; Abort from any
// thread.

#ifndef BNPS_WORKER_HOST_BN_GROUP_H_
#define BNPS_WORKER_HOST_BN_GROUP_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "nn/bn_exchange.h"

namespace bnps::worker {

class HostBnGroup {
 public:
  // REQUIRES: replicas >= 1. `upstream` is not owned and must outlive this.
  HostBnGroup(int replicas, nn::BnExchange* upstream);
  ~HostBnGroup();
  HostBnGroup(const HostBnGroup&) = delete;
  HostBnGroup& operator=(const HostBnGroup&) = delete;

  int replicas() const { return static_cast<int>(members_.size()); }
  // Replica i's exchange. REQUIRES: 0 <= i < replicas().
  nn::BnExchange* member(int i);

  // Ends the current and every later round: the replicas waiting in one,
  // and those that come later, get CANCELLED naming `status` (the replica
  // that failed keeps its own error).
  void Abort(absl::Status status);
  // Opens the group again after an Abort (a new step after a recovery).
  // REQUIRES: no replica is inside Forward or Backward.
  void Reset();

 private:
  class Member;
  enum class Phase { kForward, kBackward };

  struct Round;
  // One exchange of all replicas: files `local` under `replica`, and the
  // replica that completes the round combines the contributions in replica
  // order and calls upstream. T is bn::Moments (forward) or bn::BackwardSums.
  template <typename T>
  absl::StatusOr<T> RunRound(int replica, const std::string& layer,
                             Phase phase, const T& local);

  nn::BnExchange* const upstream_;
  std::vector<std::unique_ptr<Member>> members_;

  absl::Mutex mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Round> round_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::worker

#endif  // BNPS_WORKER_HOST_BN_GROUP_H_
