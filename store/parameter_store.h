// The parameters a shard owns, their optimizer state, and how pushed gradients
// become updates.
//
// Gradients arrive as sums over a worker's samples, with the sample count.
// Bulk-synchronous (sync, recal, local): step s of a key is applied once every
// live worker pushed (worker, s, key), with gradient sum(grads) / sum(samples),
// which makes W workers equal one worker on their concatenated batch. Steps of a
// key apply in order. Stale-synchronous (async): each push is applied on
// arrival with grad / samples; the staleness bound is enforced by the clocks.
//
// The optimizer is SGD with momentum and weight decay, as PyTorch's:
//   d = g + weight_decay * w;  buf = momentum * buf + d;  w -= lr * buf.
//
// Exactly once: a push of (worker, step, key) at or below the worker's last
// pushed step for the key is acknowledged as a duplicate and not applied again.
//
// Admissible steps: a push that is not a duplicate must be of a step the job's
// clocks could have allowed, or it is refused (FAILED_PRECONDITION) without
// changing anything. Without this a step of 10^15 would be accepted and every
// later push of that worker dropped as a duplicate.
//   bulk-synchronous  step in [v, v + 1] for a key at version v: v is the step
//                     being gathered; v + 1 may begin once a worker pulled v.
//   stale-synchronous step <= n + 1 + s, with n the newest step pushed to this
//                     store (any key, any worker; -1 before any) and s the
//                     staleness bound: a worker begins step c only once every
//                     live worker completed c - s steps, so pushed c - s - 1.
//
// A key's version is the number of updates applied to it. Pull waits until every
// requested key reached a version, or fails at its deadline naming the workers
// the oldest pending step still waits for; PullInOrder hands the keys out one
// run at a time, each as soon as it reached the version. Pulled values are shared, not
// copied: an update writes a fresh buffer while a pull still holds the current
// one, and works in place otherwise.
//
// Arithmetic: a bulk-synchronous step sums the workers' float gradients in
// double in arrival order; the first push is converted, not added to zeros,
// and the last is added inside the optimizer step, which gives the same bits
// as a separate sum with two fewer passes over memory.
//
// Checkpoints (server/shard.h): Export and Import copy the whole state, and
// Options::on_boundary hands a copy out at every step boundary (below).
//
// Thread-safety: thread-safe. Callbacks run without the store's lock held, on
// the calling thread or on the thread of the call that made them ready
// (on_boundary excepted: see Options).

#ifndef BNPS_STORE_PARAMETER_STORE_H_
#define BNPS_STORE_PARAMETER_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "util/waiters.h"

namespace bnps::store {

struct OptimizerOptions {
  double learning_rate = 0.1;  // Default: 0.1
  double momentum = 0.9;       // Default: 0.9
  double weight_decay = 0.0;   // Default: 0
};

// A copy of a store's state (values shared, not copied: the store never
// changes a buffer someone else holds).
struct StoreState {
  struct Key {
    std::string key;
    std::vector<int64_t> shape;
    std::shared_ptr<const std::vector<float>> values;
    std::vector<float> momentum;
    int64_t version = 0;
    std::vector<int64_t> last_pushed;  // by worker; -1 = none
  };
  std::vector<Key> keys;  // in key order
  int64_t applied = 0;
  int64_t duplicates = 0;
  int64_t newest_step = -1;
};

class ParameterStore {
 public:
  struct Options {
    // The worker ids the store keeps records for, [0, num_workers): every
    // step's workers are among them. Default: 1.
    int num_workers = 1;
    bool bulk_synchronous = true;  // Default: true
    OptimizerOptions optimizer;
    int64_t staleness = 0;  // stale-synchronous: the bound s. Default: 0
    // Step boundaries every `boundary_every` versions (0: none).
    // Bulk-synchronous: when every key reached version k (a multiple), which
    // happens before any worker can pull version k, so nothing of step k is
    // in yet. Stale-synchronous: when the newest version reaches a multiple.
    // on_boundary gets k and the state then; it runs with the store's lock
    // held (so the state of anything else it reads is of the same moment)
    // and must not call the store. Default: none.
    int64_t boundary_every = 0;
    std::function<void(int64_t, struct StoreState)> on_boundary;
    // Bulk-synchronous: how many workers step s waits for (ids 0..n-1; a
    // job resized while it runs, proto/membership_history.h), at most
    // num_workers; a push of a worker outside them is refused. Must not call
    // the store. Default: none (num_workers every step).
    std::function<int(int64_t)> workers_at;
  };

  struct Tensor {
    std::vector<int64_t> shape;
    // Never null. Not changed while anyone outside the store holds it.
    std::shared_ptr<const std::vector<float>> values;
    int64_t version = 0;
  };
  using Snapshot = std::map<std::string, Tensor>;
  using PullDone = std::function<void(absl::StatusOr<Snapshot>)>;
  // The next keys of an in-order pull (PullInOrder), in request order.
  struct PullPart {
    std::vector<std::pair<std::string, Tensor>> tensors;
    bool last = false;  // no call follows
  };
  using PartDone = std::function<void(absl::StatusOr<PullPart>)>;

  explicit ParameterStore(Options options);

  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  // Sets the initial value of `key`. Returns true if this call initialized it,
  // false if it was already initialized (the first value stays).
  // INVALID_ARGUMENT if values do not match the shape.
  absl::StatusOr<bool> Init(const std::string& key, std::vector<int64_t> shape,
                            std::vector<float> values);

  struct PushResult {
    bool duplicate = false;
  };
  // Pushes worker's gradient (a sum over `num_samples` samples) of `key` for
  // `step`. NOT_FOUND for a key never initialized; INVALID_ARGUMENT for a
  // worker outside the job, a negative step, num_samples < 0 or a shape
  // mismatch; FAILED_PRECONDITION for a step already applied without this
  // worker, a step the worker is not one of (Options::workers_at), a step
  // that is not admissible (above), or a worker that was removed or failed
  // (the job dropped it: its pushes change nothing). An error changes
  // nothing.
  absl::StatusOr<PushResult> Push(int worker, int64_t step,
                                  const std::string& key,
                                  absl::Span<const int64_t> shape,
                                  absl::Span<const float> grad,
                                  int64_t num_samples);

  // OK if a push of (worker, step, key) with this shape would be accepted now
  // (or acknowledged as a duplicate); otherwise the error Push would give.
  // For a receiver to check a push before it reserves room for the values.
  absl::Status CheckPush(int worker, int64_t step, const std::string& key,
                         absl::Span<const int64_t> shape) const;

  // Calls done with the values of `keys` (every key if empty) once each has
  // version >= min_version: at once if they do. NOT_FOUND for an unknown key;
  // DEADLINE_EXCEEDED after `deadline` (see ExpireDeadlines); the FailWorker status if a
  // step it waits for needs a worker marked failed.
  void Pull(std::vector<std::string> keys, int64_t min_version,
            absl::Time deadline, PullDone done);
  // Pull, key by key: calls `part` with each run of keys, in the order of
  // `keys` (every key in key order if empty), as soon as they have
  // min_version -- a key not ready holds back itself and the keys after it
  // only. The calls never overlap and come in order; the last has `last` set
  // (one call with no tensors if there are no keys), or is an error, which
  // ends the pull after the keys before it: NOT_FOUND for an unknown key
  // (before any key is sent), INVALID_ARGUMENT for a key listed twice,
  // DEADLINE_EXCEEDED, the FailWorker status, or Import's `why`, as Pull.
  void PullInOrder(std::vector<std::string> keys, int64_t min_version,
                   absl::Time deadline, PartDone part);

  // The worker leaves the job: pending steps stop waiting for it (shrink).
  void RemoveWorker(int worker);
  // The worker is lost and steps that need it cannot complete: waiting pulls
  // fail with `why`, and so do later pulls that would wait; its pushes are
  // refused with `why`.
  void FailWorker(int worker, absl::Status why);
  // Undoes RemoveWorker and FailWorker: a lost worker that never pushed came
  // back (server/shard.h says when).
  void RestoreWorker(int worker);
  // The lowest step of `worker` not yet accepted for some key: min over keys
  // of (its last pushed step + 1); INT64_MAX without keys or for an id
  // outside the job. After a rollback the worker resumes there.
  int64_t NextStep(int worker) const;
  // Whether a push of `worker` was accepted (duplicates aside); false for an
  // id outside the job.
  bool Pushed(int worker) const;

  // Fails waiting pulls whose deadline is at or before `now`.
  void ExpireDeadlines(absl::Time now);

  // The highest version of any key (0 without keys): under bulk-synchronous
  // training, the number of steps whose update some key has applied. Takes
  // no lock (the BN path reads it on every call, and must not wait behind an
  // optimizer step).
  int64_t newest_version() const {
    return newest_version_.load(std::memory_order_acquire);
  }

  // The state now (pending steps of the bulk-synchronous policies are not
  // part of it: Export is meant for step boundaries).
  StoreState Export() const;
  // Replaces the state with `state` (pending steps dropped); every waiting
  // pull fails with `why`. Which workers are live or failed stays.
  // INVALID_ARGUMENT, changing nothing, if `state` does not fit the job
  // (exactly-once records of another worker count, values that do not match
  // their shape).
  absl::Status Import(const StoreState& state, const absl::Status& why);

  struct Stats {
    int num_keys = 0;
    int64_t min_version = 0;
    int64_t applied = 0;     // pushes accepted
    int64_t duplicates = 0;  // pushes acknowledged as duplicates
    int64_t num_values = 0;  // floats over every key
  };
  Stats GetStats() const;

 private:
  struct PendingStep {
    std::vector<bool> pushed;  // by worker
    std::vector<double> sum;   // gradient sum, in double; empty until a push
    int64_t samples = 0;
  };
  struct Param {
    std::vector<int64_t> shape;
    std::shared_ptr<std::vector<float>> values;  // shared with pulls
    std::shared_ptr<std::vector<float>> spare_values;  // a pull's old buffer
    int64_t version = 0;
    std::vector<float> momentum_buffer;
    std::vector<int64_t> last_pushed;  // by worker; -1 = none
    std::map<int64_t, PendingStep> pending;  // bulk-synchronous only
    std::vector<double> spare_sum;  // a finished step's buffer, reused
  };
  struct Waiter {
    std::vector<std::string> keys;
    int64_t min_version;
    absl::Time deadline;
    PullDone done;
  };
  // An in-order pull's parts, queued under mu_ (so in order) and handed to
  // its callback by whichever thread drains the queue first.
  struct PartQueue {
    explicit PartQueue(PartDone d) : done(std::move(d)) {}
    void Drain();
    absl::Mutex mu;
    std::deque<absl::StatusOr<PullPart>> parts ABSL_GUARDED_BY(mu);
    bool draining ABSL_GUARDED_BY(mu) = false;
    const PartDone done;
  };
  struct StreamWaiter {
    std::vector<std::string> keys;
    size_t sent = 0;  // keys[0, sent) went out
    int64_t min_version;
    absl::Time deadline;
    std::shared_ptr<PartQueue> out;
  };
  using Ready = util::ReadyCallbacks;

  absl::Status CheckArguments(int worker, int64_t step,
                              int64_t num_samples) const;
  // Checks a push of `p`; sets *duplicate if it is one. Changes nothing.
  absl::Status Admit(const Param& p, int worker, int64_t step,
                     const std::string& key, absl::Span<const int64_t> shape,
                     bool* duplicate) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One optimizer step with gradient (sum + grad) / samples; either of sum
  // and grad may be null (counts as zeros).
  void Apply(Param& p, const double* sum, const float* grad, int64_t samples)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies every complete pending step of `p`, in order.
  void ApplyReady(Param& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every live worker of `step` pushed `s`.
  bool Complete(int64_t step, const PendingStep& s) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The workers of `step` (Options::workers_at).
  int WorkersAt(int64_t step) const;
  // OK if `keys` are ready, an error if they never will be,
  // nullopt if they may become ready later.
  std::optional<absl::StatusOr<Snapshot>> TryPull(const Waiter& w) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves satisfied waiters' callbacks to `ready`.
  void CollectReady(Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string MissingWorkers(const Waiter& w) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for `keys` (every key if empty).
  std::string MissingWorkers(absl::Span<const std::string> keys,
                             int64_t min_version) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The status of a worker marked failed that `p`'s next step waits for;
  // OK if none.
  absl::Status FailedFor(const Param& p) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the keys of `w` that are ready now (and an error if one never
  // will be); true if `w` is done.
  bool StepStream(StreamWaiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends every in-order pull that `end` gives a status for, queueing it
  // (nullopt: not this one); adds the drains to `ready`.
  template <typename End>
  void EndStreams(End end, Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  StoreState ExportLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls on_boundary if `p`'s update made a step boundary.
  void MaybeBoundary(const Param& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;

  mutable absl::Mutex mu_;
  std::map<std::string, Param> params_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> live_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> failed_ ABSL_GUARDED_BY(mu_);  // OK = not failed
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::vector<StreamWaiter> streams_ ABSL_GUARDED_BY(mu_);
  int64_t applied_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t duplicates_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t newest_step_ ABSL_GUARDED_BY(mu_) = -1;  // of any accepted push
  int64_t last_boundary_ ABSL_GUARDED_BY(mu_) = 0;  // version of the last one
  // Written under mu_, read without it.
  std::atomic<int64_t> newest_version_{0};
};

}  // namespace bnps::store

#endif  // BNPS_STORE_PARAMETER_STORE_H_
