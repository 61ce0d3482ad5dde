// The gRPC client's membership in the job: registration with every shard
// (agreeing on the job's config), heartbeats, the bounded-staleness clocks
// kept by shard 0, and status queries. Internal to client/.
//
// Thread-safety: thread-safe. The Channels must outlive it.

#ifndef BNPS_CLIENT_INTERNAL_MEMBERSHIP_H_
#define BNPS_CLIENT_INTERNAL_MEMBERSHIP_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/grpc_options.h"
#include "client/internal/channels.h"
#include "proto/bnps.pb.h"

namespace bnps::client::internal {

class Membership {
 public:
  explicit Membership(Channels* channels) : channels_(channels) {}

  // Registers with every shard, retrying UNAVAILABLE (a server still
  // starting) and DEADLINE_EXCEEDED with backoff until `deadline` (each
  // attempt gets at most rpc_timeout), and returns the job's config once every shard's agrees
  // with the options and with shard 0's (FAILED_PRECONDITION naming the
  // difference otherwise). A shard not reached by `deadline`: UNAVAILABLE or
  // DEADLINE_EXCEEDED naming its address and connect_timeout.
  absl::StatusOr<proto::JobConfig> Register(absl::Time deadline);

  // One heartbeat to every shard, each with a short deadline; failures are
  // counted, not returned. Does nothing once Stop was called.
  void SendHeartbeats() ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels a heartbeat in flight and makes later ones no-ops.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  HeartbeatStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // The async policy's clocks, kept by shard 0 (see PsClient).
  absl::StatusOr<int64_t> StartStep(int64_t step);
  absl::Status FinishStep(int64_t completed);

  // What shard `shard` knows. INVALID_ARGUMENT for a shard out of range.
  absl::StatusOr<proto::StatusResponse> GetStatus(int shard);

 private:
  absl::Status CheckConfigs(
      const std::vector<proto::RegisterResponse>& responses) const;

  Channels* const channels_;  // not owned

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* heartbeat_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  HeartbeatStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_MEMBERSHIP_H_
