// The gRPC client's GradientPush (client/ps_client.h): each part is sent as
// soon as it is handed over, from a sender thread of the push's own, so the
// caller's backward pass computes on while the gradients travel. Parts that
// queue up while a send is in flight go out together in the next one (one
// PushGradients call per shard that owns any of their keys), so a fast
// backward pass costs no more calls than it needs. Sends are retried as
// BulkTransfer's pushes are; the servers apply each (worker, step, key) once.
// Internal to client/.
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
  // Pushes of `step` over `num_samples` samples through `bulk` (not owned).
  // If `refused` is not OK nothing is sent and Finish returns it.
  StreamingPush(BulkTransfer* bulk, int64_t step, int64_t num_samples,
                absl::Status refused = absl::OkStatus());
  ~StreamingPush() override;

  void Add(std::shared_ptr<const Params> part) override;
  absl::Status Finish() override;

 private:
  void SendLoop() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  BulkTransfer* const bulk_;  // not owned
  const int64_t step_;
  const int64_t num_samples_;

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<const Params>> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // the first error

  std::thread sender_;  // not started when refused
  bool finished_ = false;
};

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_STREAMING_PUSH_H_
