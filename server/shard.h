// One shard server's state and logic, without any network: the parameters it
// owns, BN aggregation, membership, and (on shard 0 under the async policy) the
// workers' clocks. The gRPC service (server/shard_service.h) translates
// requests into calls on these.
//
// A ticker thread calls Tick every `tick` to turn silent workers into lost ones
// (fail: steps that need them fail with FAILED_PRECONDITION; shrink: they are
// dropped and steps complete with the others) and to expire deadlines. Tests
// may run without the ticker and call Tick with a time of their choosing.
// Either way the job has dropped a lost worker: its pushes, BN contributions
// and clock updates are refused (FAILED_PRECONDITION), so it changes nothing.
//
// Workers join through Register. A lost worker may register again (a
// relaunch, with a new incarnation) only if it never took part in the job on
// this shard, which Register defines exactly; otherwise it stays lost.
//
// Thread-safety: thread-safe.

#ifndef BNPS_SERVER_SHARD_H_
#define BNPS_SERVER_SHARD_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/bn_aggregator.h"
#include "server/step_clocks.h"
#include "server/membership.h"
#include "server/parameter_store.h"
#include "policy/policy.h"

namespace bnps::server {

struct ShardOptions {
  std::string job = "bnps";                  // Default: "bnps"
  int shard = 0;                             // Default: 0
  int num_shards = 1;                        // Default: 1
  int num_workers = 1;                       // Default: 1
  policy::Policy policy = policy::Policy::kSync;             // Default: sync
  int64_t staleness = 0;                     // async only. Default: 0
  OptimizerOptions optimizer;                // Default: see OptimizerOptions
  double bn_momentum = 0.1;                  // Default: 0.1
  absl::Duration barrier_timeout = absl::Seconds(60);    // Default: 60 s
  absl::Duration heartbeat_timeout = absl::Seconds(10);  // Default: 10 s
  policy::WorkerLoss worker_loss = policy::WorkerLoss::kFail;            // Default: fail
  absl::Duration tick = absl::Milliseconds(20);          // Default: 20 ms
  bool start_ticker = true;                  // Default: true
  std::function<absl::Time()> now = absl::Now;  // Default: absl::Now
};

class Shard {
 public:
  // INVALID_ARGUMENT for inconsistent options (counts < 1, shard out of range,
  // negative staleness or timeouts, learning rate <= 0, ...).
  static absl::StatusOr<std::unique_ptr<Shard>> Create(ShardOptions options);
  ~Shard();  // stops the ticker; fails what still waits

  const ShardOptions& options() const { return options_; }
  ParameterStore& store() { return store_; }
  BnAggregator& bn() { return bn_; }
  Membership& membership() { return membership_; }
  // Non-null on shard 0 under the async policy.
  StepClocks* clocks() { return clocks_.get(); }

  // OK if the request belongs to this job and names a worker of it.
  absl::Status CheckCaller(const std::string& job, int worker) const;

  // Registers `worker`, run by the process `incarnation` (nonzero), as
  // Membership::Register does: a retry of the same incarnation is OK, another
  // incarnation of a live worker is FAILED_PRECONDITION. A lost worker
  // rejoins (is live again under `incarnation`) if it never took part in the
  // job on this shard: no push of it was accepted here (duplicates aside),
  // no BN contribution of it (forward, backward, recalibration, local
  // running stats), and its clock is 0 (no FinishStep, shard 0 under async).
  // Under shrink the job must also not have begun here without it: no push
  // or BN contribution of any worker was accepted, and every clock is 0.
  // Otherwise FAILED_PRECONDITION saying why. Errors for the id and the
  // incarnation as Membership's.
  absl::Status Register(int worker, uint64_t incarnation);

  // INVALID_ARGUMENT unless this shard owns `key` (proto/sharding.h).
  absl::Status CheckOwned(const std::string& key) const;

  // The deadline of a wait that starts now.
  absl::Time Deadline() const { return options_.now() + options_.barrier_timeout; }

  // Applies heartbeat losses and expires deadlines as of `now`.
  void Tick(absl::Time now);

  // Fails every wait now, as at its deadline (shutting down).
  void ExpireAllWaits();

 private:
  explicit Shard(ShardOptions options);

  // OK if lost `worker` may rejoin (Register's rule); otherwise why not.
  absl::Status MayRejoin(int worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(join_mu_);
  // Fails or drops the workers lost as of `now`.
  void HandleLosses(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(join_mu_);

  const ShardOptions options_;
  ParameterStore store_;
  BnAggregator bn_;
  Membership membership_;
  std::unique_ptr<StepClocks> clocks_;
  // Held while a worker turns lost (Tick) or rejoins (Register), so that a
  // rejoin sees a loss either not at all or applied to every component.
  absl::Mutex join_mu_;

  absl::Notification stop_;
  std::thread ticker_;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_SHARD_H_
