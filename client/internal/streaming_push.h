// The gRPC client's GradientPush (client/ps_client.h): parts are sent while
// the caller goes on computing, from a sender thread of the push's own,
// once those not yet sent hold at least `min_bytes` of gradients (a send
// costs a call per shard, worth it only for enough data); the rest goes in
// Finish, from the caller's thread if nothing was sent before. Parts that
// queue up while a send is in flight go out together in the next one. Sends
// are retried as BulkTransfer's pushes are; the servers apply each (worker,
// step, key) once. Internal to client/.
//
// Thread-safety: Add and Finish from one thread; the Channels behind `bulk`
// must outlive the push.

#ifndef BNPS_CLIENT_INTERNAL_STREAMING_PUSH_H_
#define BNPS_CLIENT_INTERNAL_STREAMING_PUSH_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/internal/bulk_transfer.h"
#include "client/ps_client.h"

namespace bnps::client::internal {

class StreamingPush final : public GradientPush {
 public:
  using Parts = std::vector<std::shared_ptr<const Params>>;

  // Pushes of `step` over `num_samples` samples through `bulk` (not owned),
  // in sends of at least `min_bytes` (>= 0) but the last. If `refused` is
  // not OK nothing is sent and Finish returns it.
  StreamingPush(BulkTransfer* bulk, int64_t step, int64_t num_samples,
                int64_t min_bytes, absl::Status refused = absl::OkStatus());
  ~StreamingPush() override;

  void Add(std::shared_ptr<const Params> part) override;
  absl::Status Finish() override;
  void Abandon() override;

 private:
  // One send of `parts`; the first error is kept.
  void Send(Parts parts) ABSL_LOCKS_EXCLUDED(mu_);
  void SendLoop() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  BulkTransfer* const bulk_;  // not owned
  const int64_t step_;
  const int64_t num_samples_;
  const int64_t min_bytes_;

  // The caller's: parts not yet handed to the sender, and their bytes.
  Parts pending_;
  int64_t pending_bytes_ = 0;
  bool refused_ = false;
  bool finished_ = false;
  std::thread sender_;  // started by the first send before Finish

  mutable absl::Mutex mu_;
  Parts queue_ ABSL_GUARDED_BY(mu_);  // for the sender
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // the first error
};

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_STREAMING_PUSH_H_
