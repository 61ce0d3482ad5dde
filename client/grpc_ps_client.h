// GrpcPsClient: the PsClient (client/ps_client.h) of real shard servers,
// speaking the protocol of proto/bnps.proto over gRPC. One per worker.
//
// It routes every key to the shard that owns it (proto::ShardForKey), chunks
// large tensors, keeps one long-lived BnSync stream per shard for the
// latency-bound per-layer BN traffic, and heartbeats every shard from a
// background thread.
//
// Example (one worker of a sync job):
//   GrpcClientOptions options;
//   options.servers = {"ps0:7000", "ps1:7000"};
//   options.job = "resnet";
//   options.worker = 3;
//   options.num_workers = 4;
//   absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
//       GrpcPsClient::Connect(options);
//   if (!client.ok()) return client.status();
//   Trainer trainer(client->get(), ...);  // or the calls of PsClient
//
// Deadlines and retries. Every call carries a deadline of rpc_timeout per
// attempt (a BN call: rpc_timeout in all, its one retry included; calls that
// may wait on a barrier: at least the servers' barrier timeout plus 5 s).
// Calls are retried when they fail with UNAVAILABLE or ABORTED (not an
// ABORTED "... the job rolls back ...": see Recover), up to
// max_attempts attempts with exponential backoff -- all are safe to repeat:
// the servers deduplicate pushes and BN requests, and the rest are reads or
// idempotent. DEADLINE_EXCEEDED is not retried: the server may still be
// working on the call. Connect retries UNAVAILABLE (servers still starting)
// and DEADLINE_EXCEEDED until connect_timeout has passed instead of counting
// attempts.
//
// Errors, beyond PsClient's: a failed call's message is prefixed with the rpc
// and the shard ("PushGradients of step 3 to shard 1 (host:port): ...");
// a malformed answer is INVALID_ARGUMENT "malformed response from shard N".
// Once a shard answers a heartbeat with FAILED_PRECONDITION (this worker was
// lost, and the job dropped it; or another process took its place), every
// call fails at once with FAILED_PRECONDITION saying so
// (HeartbeatStats::dropped): a process the job no longer counts stops
// instead of going on.
//
// Thread-safety: thread-safe; calls on different shards run in parallel and
// BN calls from several threads share one stream per shard. The destructor
// must not run concurrently with any other call.

#ifndef BNPS_CLIENT_GRPC_PS_CLIENT_H_
#define BNPS_CLIENT_GRPC_PS_CLIENT_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/grpc_options.h"
#include "client/ps_client.h"

namespace bnps::client {

namespace internal {
class BnCalls;
class BulkTransfer;
class Channels;
class Membership;
class TaskThreads;
}  // namespace internal

class GrpcPsClient final : public PsClient {
 public:
  // Validates `options` (INVALID_ARGUMENT), opens one channel per shard,
  // reads every shard's config (UNAVAILABLE or DEADLINE_EXCEEDED, naming the
  // shard's address, when one cannot be reached within connect_timeout),
  // checks that it agrees with the options and with shard 0's
  // (FAILED_PRECONDITION, naming the difference) and passes
  // options.check_config, and only then registers with every shard and
  // starts heartbeating. A worker id that another live process runs is
  // refused (FAILED_PRECONDITION naming it).
  static absl::StatusOr<std::unique_ptr<GrpcPsClient>> Connect(
      GrpcClientOptions options);

  GrpcPsClient(const GrpcPsClient&) = delete;
  GrpcPsClient& operator=(const GrpcPsClient&) = delete;

  // Stops the heartbeat and closes the BN streams (at most 1 s of grace for
  // the servers to end them); BN calls still waiting fail with UNAVAILABLE.
  ~GrpcPsClient() override;

  const proto::JobConfig& config() const override;
  int worker() const override;
  int num_workers() const override;

  // InitParameters is not chunked: INVALID_ARGUMENT for a single tensor too
  // large for one message (about kMaxMessageBytes / 4 floats).
  absl::Status InitParameters(const Params& params) override;
  absl::Status PushGradients(int64_t step, int64_t num_samples,
                             const Params& grads) override;
  absl::Status PushGradients(int64_t step, int64_t num_samples,
                             std::shared_ptr<const Params> grads) override;
  // Sends the parts from a thread of its own once the unsent ones hold
  // options.push_part_bytes, the rest in Finish
  // (client/internal/streaming_push.h).
  std::unique_ptr<GradientPush> StartPush(int64_t step,
                                          int64_t num_samples) override;
  absl::Status PullParametersInto(int64_t min_version,
                                  Params* params) override;
  // One in_order call per shard, all at once, each key usable as soon as
  // it is in (client/internal/streaming_pull.h).
  std::unique_ptr<ParameterPull> StartPull(int64_t min_version,
                                           const std::vector<std::string>& keys,
                                           Params* into) override;
  using PsClient::PullParameters;
  // Only `keys` (duplicates allowed), from the shards that own them;
  // NOT_FOUND if a shard does not send a requested key. Empty `keys` gives
  // an empty map without any call.
  absl::StatusOr<Params> PullParameters(const std::vector<std::string>& keys,
                                        int64_t min_version);

  absl::StatusOr<BnForwardResult> BnForward(const std::string& layer,
                                            int64_t step,
                                            const bn::Moments& local,
                                            bool want_running = false) override;
  absl::StatusOr<bn::BackwardSums> BnBackward(
      const std::string& layer, int64_t step,
      const bn::BackwardSums& local) override;
  absl::Status BnRecal(const std::string& layer, int64_t batch,
                       const bn::Moments& moments) override;
  absl::StatusOr<bn::RunningStats> BnRecalFinish(
      const std::string& layer) override;
  absl::StatusOr<bn::RunningStats> BnLocalRunning(
      const std::string& layer, const bn::RunningStats& running) override;
  absl::StatusOr<bn::RunningStats> BnRunning(const std::string& layer,
                                             int64_t channels) override;

  absl::StatusOr<int64_t> StartStep(int64_t step) override;
  absl::Status FinishStep(int64_t completed) override;
  // Shard 0's answer to the latest heartbeat.
  std::vector<int> LiveWorkers() const override;
  // As PsClient's; waits up to connect_timeout plus the call timeout for
  // shards that are down (restarting). Not concurrently with other calls.
  absl::StatusOr<int64_t> Recover(bool restarted) override;
  bool rejoining() const override;
  google::protobuf::RepeatedPtrField<proto::MembershipSegment> membership()
      const override;
  // As PsClient's; not concurrently with other calls.
  absl::StatusOr<int64_t> Join() override;
  absl::StatusOr<int64_t> LeaveEarly() override;
  // As PsClient's; tells every shard at once (retrying UNAVAILABLE), then
  // stops heartbeating. Not concurrently with other calls.
  absl::Status Leave() override;

  // What shard `shard` knows. INVALID_ARGUMENT for a shard out of range.
  absl::StatusOr<proto::StatusResponse> GetStatus(int shard);
  HeartbeatStats heartbeat_stats() const;
  const GrpcClientOptions& options() const;
  int num_shards() const;

 private:
  // Join (grow) or LeaveEarly.
  absl::StatusOr<int64_t> Resize(bool grow);
  explicit GrpcPsClient(GrpcClientOptions options);
  // Heartbeats, and cancels BN writes stuck past their deadline.
  void BackgroundLoop() ABSL_LOCKS_EXCLUDED(bg_mu_);

  const std::unique_ptr<internal::Channels> channels_;
  const std::unique_ptr<internal::Membership> membership_;
  const std::unique_ptr<internal::BulkTransfer> bulk_;
  const std::unique_ptr<internal::BnCalls> bn_;
  // One per shard, for StartPull's calls.
  const std::unique_ptr<internal::TaskThreads> pull_threads_;

  absl::Mutex bg_mu_;
  bool stopping_ ABSL_GUARDED_BY(bg_mu_) = false;
  std::thread background_;
};

}  // namespace bnps::client

#endif  // BNPS_CLIENT_GRPC_PS_CLIENT_H_
