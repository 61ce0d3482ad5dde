// The worker's client of the shard servers: one PsClient per worker process.
//
// PsClient speaks the protocol of proto/bnps.proto to S shard servers. It
// routes every key (a parameter tensor or a BN layer) to the shard that owns it
// (proto::ShardForKey), chunks large tensors, keeps one long-lived BnSync
// stream per shard for the latency-bound per-layer BN traffic, and heartbeats
// every shard from a background thread.
//
// Example (one worker of a sync job):
//   PsClientOptions options;
//   options.servers = {"ps0:7000", "ps1:7000"};
//   options.job = "resnet";
//   options.worker = 3;
//   options.num_workers = 4;
//   absl::StatusOr<std::unique_ptr<PsClient>> client =
//       PsClient::Connect(options);
//   if (!client.ok()) return client.status();
//   ... (*client)->InitParameters(initial) ...
//   for (int64_t step = 0; step < steps; ++step) {
//     auto params = (*client)->PullParameters(/*min_version=*/step);
//     ... forward: (*client)->BnForward(layer, step, local_moments) per layer
//     ... backward: (*client)->BnBackward(layer, step, local_sums) per layer
//     ... (*client)->PushGradients(step, batch_size, grads) ...
//   }
//
// Deadlines and retries. Every call carries a deadline of rpc_timeout per
// attempt (a BN call: rpc_timeout in all, its one retry included). Calls that
// are safe to repeat -- all of them: pushes are deduplicated by the server on
// (worker, step, key), BN requests on (worker, step, layer, phase), the rest
// are reads or idempotent -- are retried when they fail with UNAVAILABLE or
// ABORTED, up to max_attempts attempts with exponential backoff
// (initial_backoff, doubling, capped at 2 s, +-20% jitter). DEADLINE_EXCEEDED
// is not retried: the server may still be working on the call, and waiting
// another rpc_timeout rarely helps. Connect retries UNAVAILABLE (servers still
// starting) until rpc_timeout has passed instead of counting attempts.
//
// Errors: INVALID_ARGUMENT for bad arguments (checked before anything is sent)
// and for malformed responses (the proto/codec.h validation; the message says
// "malformed response from shard N"; a BN answer whose id cannot be read
// drops the stream instead: UNAVAILABLE); FAILED_PRECONDITION when the servers'
// job config disagrees with the options or with itself; otherwise the status
// the server or the transport gave, its message prefixed with the rpc and the
// shard ("PushGradients to shard 1 (host:port): ..."). A BN response with a
// non-zero code becomes an absl::Status with that code and message.
//
// Thread-safety: thread-safe; every method may be called from several threads
// at once. Calls on different shards run in parallel; BN calls from several
// threads share one stream per shard. The destructor must not run concurrently
// with any other call.

#ifndef BNPS_WORKER_PS_CLIENT_H_
#define BNPS_WORKER_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/bn_wire.h"
#include "proto/bnps.pb.h"

namespace bnps::worker {

struct PsClientOptions {
  // Shard i is served at servers[i], as "host:port" (any gRPC target).
  // Default: none; at least one is required.
  std::vector<std::string> servers;
  // The job's name; every server of the job must run a job of this name.
  // Default: none; required.
  std::string job;
  // This worker's id, in [0, num_workers).
  // Default: 0.
  int worker = 0;
  // Workers in the job; must match the servers' config.
  // Default: 1.
  int num_workers = 1;
  // Deadline of every call attempt; also bounds Connect (registration with all
  // shards, retries included) and each BN call (its retry included). StartStep,
  // sync BN exchanges and PullParameters with a min_version may wait on the
  // server for other workers, so this should exceed the servers'
  // barrier_timeout_ms. Must be finite and positive.
  // Calls that may wait on the servers' barriers (BN, pulls of a version,
  // StartStep) wait at least the servers' barrier_timeout_ms plus 5 s, so
  // the server's error naming the missing workers arrives first.
  // Default: 30 s.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Attempts per call for retryable failures (UNAVAILABLE, ABORTED); >= 1.
  // Default: 5.
  int max_attempts = 5;
  // The first backoff between attempts; doubles each time up to 2 s. Also the
  // first reconnect backoff of the channels. >= 0.
  // Default: 50 ms.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  // How often the background thread heartbeats every shard; must be positive
  // and shorter than the servers' heartbeat_timeout_ms.
  // Default: 500 ms.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // Channel credentials, e.g. from proto::MakeChannelCredentials for TLS.
  // Default: nullptr, meaning grpc::InsecureChannelCredentials().
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // The job token (proto/job_token.h), sent with every call; empty: none.
  // Default: empty.
  std::string token;
};

// A dense row-major float32 tensor: a parameter or a gradient.
struct Param {
  std::vector<int64_t> shape;
  std::vector<float> values;  // product(shape) elements
};

// What a BN forward exchange returns.
struct BnForwardResult {
  // The moments to normalize with (sync: the global batch's; async: the merge
  // of the admissible others' moments, see docs/design.md).
  bn::Moments merged;
  // The server's running stats after this step, when asked for.
  std::optional<bn::RunningStats> running;
  // Workers merged into `merged`.
  int contributors = 0;
};

// Counters of the background heartbeat.
struct HeartbeatStats {
  int64_t sent = 0;         // Heartbeat calls made (to all shards)
  int64_t failed = 0;       // of which failed; failures are not fatal
  absl::Status last_error;  // the most recent failure, annotated; OK if none
  // Workers live according to shard 0's latest answer.
  std::vector<int> live_workers;
};

class PsClient {
 public:
  // Validates `options` (INVALID_ARGUMENT), opens one channel per shard
  // (message size limits set to proto::kMaxMessageBytes both ways), registers
  // with every shard (retrying UNAVAILABLE with backoff until rpc_timeout has
  // passed: UNAVAILABLE or DEADLINE_EXCEEDED when a shard cannot be reached in
  // time), checks that every shard's JobConfig agrees with the options and with
  // shard 0's (FAILED_PRECONDITION, naming the difference), and starts
  // heartbeating.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(
      PsClientOptions options);

  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  // Stops the heartbeat, half-closes every BN stream, gives the servers a
  // moment (at most 1 s, or rpc_timeout if shorter) to end them, then cancels
  // what is left and drains the streams. Never waits longer than that.
  // BN calls still waiting fail with UNAVAILABLE.
  ~PsClient();

  // The job as shard 0 runs it (its `shard` field is 0); every shard agreed on
  // everything else at Connect.
  const proto::JobConfig& config() const { return config_; }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  const PsClientOptions& options() const { return options_; }

  // Sends initial values to the shards that own them (the first initialization
  // of a key wins on the server; later ones are acknowledged and ignored). One
  // InitParameters call per shard, or several when the values of a shard do not
  // fit one message. INVALID_ARGUMENT for a bad key (empty, or longer than
  // proto::kMaxKeyBytes), a shape that does not match the values, or a single
  // tensor too large for one message (InitParameters is not chunked: a tensor
  // of about kMaxMessageBytes / 4 floats or more must be initialized
  // otherwise).
  absl::Status InitParameters(const std::map<std::string, Param>& params);

  // Pushes the gradients of `step`, summed over `num_samples` samples. Each
  // shard gets one client-streaming PushGradients call with its keys, tensors
  // cut into proto::kChunkFloats-element chunks and packed into messages of at
  // most proto::kBulkMessageBytes (one full chunk, or many small tensors);
  // every message carries (job, worker, step, num_samples). Shards are pushed
  // in parallel; a shard with none of the keys gets no call. Retried as
  // described above (the server deduplicates).
  // INVALID_ARGUMENT for a negative step or num_samples or a bad key or shape.
  absl::Status PushGradients(int64_t step, int64_t num_samples,
                             const std::map<std::string, Param>& grads);
  // The same without copying the tensors: the messages reference them, and
  // `grads` stays alive as long as gRPC holds any of them. The values must
  // not change until the call returns.
  absl::Status PushGradients(
      int64_t step, int64_t num_samples,
      std::shared_ptr<const std::map<std::string, Param>> grads);

  // Every parameter of every shard, once each requested key has had at least
  // `min_version` updates applied (0 never waits; the wait counts against
  // rpc_timeout). Shards are pulled in parallel and their tensors reassembled
  // from chunks. INVALID_ARGUMENT (malformed response) if a shard sends a key
  // it does not own, a key twice, or an incomplete tensor.
  absl::StatusOr<std::map<std::string, Param>> PullParameters(
      int64_t min_version);
  // Only `keys` (duplicates allowed), from the shards that own them; NOT_FOUND
  // if a shard does not send a requested key. Empty `keys` gives an empty map
  // without any call.
  absl::StatusOr<std::map<std::string, Param>> PullParameters(
      const std::vector<std::string>& keys, int64_t min_version);
  // The keys of `*params` (every key if it is empty), written into its
  // entries: their buffers are reused, which saves allocating and faulting in
  // fresh memory at every pull of large parameters. Errors as above; after an
  // error the entries' values are unspecified.
  absl::Status PullParametersInto(int64_t min_version,
                                  std::map<std::string, Param>* params);

  // BN exchanges, one BnSync round trip each (see BnCall, below); responses
  // are decoded and validated with proto/codec.h against the number of
  // channels sent. INVALID_ARGUMENT for invalid local values
  // (bn::ValidateMoments, sums or stats of unequal or zero size).
  //
  // BN_FORWARD: this worker's moments of `layer` at `step`; returns what to
  // normalize with, and with `want_running` the server's running stats after
  // the step (sync, async).
  absl::StatusOr<BnForwardResult> BnForward(const std::string& layer,
                                            int64_t step,
                                            const bn::Moments& local,
                                            bool want_running = false);
  // BN_BACKWARD (sync): this worker's backward sums; returns the global sums.
  absl::StatusOr<bn::BackwardSums> BnBackward(const std::string& layer,
                                              int64_t step,
                                              const bn::BackwardSums& local);
  // BN_RECAL: the moments of recalibration batch `batch`.
  absl::Status BnRecal(const std::string& layer, int64_t batch,
                       const bn::Moments& moments);
  // BN_RECAL_FINISH: all of this worker's batches for `layer` are in; returns
  // the population stats once every worker's are (waits up to rpc_timeout).
  absl::StatusOr<bn::RunningStats> BnRecalFinish(const std::string& layer);
  // BN_LOCAL_RUNNING: this worker's running stats; returns the average over
  // workers once every worker's are in.
  absl::StatusOr<bn::RunningStats> BnLocalRunning(
      const std::string& layer, const bn::RunningStats& running);
  // BN_RUNNING: the running stats of `layer` (with `channels` channels) as its
  // shard holds them now; NOT_FOUND before the shard has any.
  absl::StatusOr<bn::RunningStats> BnRunning(const std::string& layer,
                                             int64_t channels);

  // Bounded-staleness clocks, kept by shard 0. StartStep blocks until this
  // worker may begin `step` (the server answers at once unless the bound would
  // break, and fails at its barrier timeout naming the laggards); FinishStep
  // reports that `completed` steps are done. StartStep returns the slowest
  // live worker's clock when it admitted the step (step - that is how stale
  // this worker's view may be).
  absl::StatusOr<int64_t> StartStep(int64_t step);
  absl::Status FinishStep(int64_t completed);

  // What shard `shard` knows. INVALID_ARGUMENT for a shard out of range.
  absl::StatusOr<proto::StatusResponse> GetStatus(int shard);

  HeartbeatStats heartbeat_stats() const ABSL_LOCKS_EXCLUDED(bg_mu_);

 private:
  class BnStream;
  struct Shard {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<proto::ParameterServer::Stub> stub;
    // The bulk methods, called raw (messages framed by proto/tensor_wire).
    std::unique_ptr<grpc::internal::RpcMethod> push_method;
    std::unique_ptr<grpc::internal::RpcMethod> pull_method;
  };

  PsClient(PsClientOptions options, std::vector<Shard> shards);

  // Deadline of a call after Connect: rpc_timeout, or the servers' barrier
  // timeout plus 5 s if that is longer.
  absl::Duration CallTimeout() const;
  absl::Status RegisterAll(absl::Time deadline);
  absl::Status CheckConfigs(
      const std::vector<proto::RegisterResponse>& responses);

  // Runs attempt(deadline) up to max_attempts times while it fails with a
  // retryable code, sleeping a backoff between attempts.
  template <typename Attempt>
  absl::Status WithRetries(Attempt attempt);
  absl::Duration Backoff(int retry) ABSL_LOCKS_EXCLUDED(rng_mu_);

  absl::Status InitShard(int shard, const std::vector<const std::string*>& keys,
                         const std::map<std::string, Param>& params);
  // Copies the tensors into the messages, or references them if `owner`
  // (which keeps `grads` alive) is not null.
  absl::Status PushAll(int64_t step, int64_t num_samples,
                       const std::map<std::string, Param>& grads,
                       const std::shared_ptr<const void>& owner);
  absl::Status PushShard(int shard, int64_t step, int64_t num_samples,
                         const std::vector<const std::string*>& keys,
                         const std::map<std::string, Param>& grads,
                         const std::shared_ptr<const void>& owner,
                         absl::Time deadline);
  // Where a pulled tensor goes: the entry for `key`, or nullptr if the key
  // was not requested. Called from one thread per shard at once.
  using PullSlot = std::function<Param*(int shard, const std::string& key)>;
  // Pulls `keys` (every key if empty) of `shard` into the slots.
  absl::Status PullShard(int shard, const std::vector<std::string>& keys,
                         int64_t min_version, const PullSlot& slot,
                         absl::Time deadline);
  absl::Status PullFrom(
      const std::vector<std::vector<std::string>>& keys_by_shard,
      const std::vector<int>& shards, int64_t min_version,
      const PullSlot& slot);

  // The current stream of `shard`, opened if there is none or it broke.
  std::shared_ptr<BnStream> GetStream(int shard)
      ABSL_LOCKS_EXCLUDED(streams_mu_);

  void BackgroundLoop() ABSL_LOCKS_EXCLUDED(bg_mu_);
  void SendHeartbeats() ABSL_LOCKS_EXCLUDED(bg_mu_);

  std::string ShardName(int shard) const;

  // A BN call's answer: the response's fields but its statistics, and the
  // statistics as they arrived, for the caller to decode.
  struct BnAnswer {
    proto::BnResponse head;
    proto::BnStatsIn stats;
  };
  // One BnSync exchange with the shard that owns head.layer(): frames `head`
  // (with its job and worker set) and `stats` once, writes them with a fresh
  // id on that shard's stream (opened at first use, reopened after it breaks)
  // and blocks until the response with the same id arrives. A non-zero
  // response code becomes that status; a BnResponse whose statistics cannot be
  // read, INVALID_ARGUMENT; bytes whose id cannot be read drop the stream
  // (UNAVAILABLE, retried once as a break is). If the stream breaks while the
  // call is in flight, the call is repeated once on a fresh stream (the server
  // deduplicates); a second break gives UNAVAILABLE. DEADLINE_EXCEEDED if no
  // response arrives within rpc_timeout. A stream the server ends with a
  // definite error (e.g. PERMISSION_DENIED, INVALID_ARGUMENT) fails its calls
  // with that code, without a retry. INVALID_ARGUMENT for an empty or too long
  // layer or a request larger than kMaxMessageBytes. REQUIRES: head.phase() is
  // set (the callers build `head` with BnHead).
  absl::StatusOr<BnAnswer> BnCall(proto::BnRequest head,
                                  const proto::BnStatsOut& stats);

  // BnCall for the phases answered with running stats (of `channels`
  // channels; -1: any number).
  absl::StatusOr<bn::RunningStats> BnCallForRunning(
      proto::BnRequest head, const proto::BnStatsOut& stats, int64_t channels);
  // INVALID_ARGUMENT for a malformed BN response, naming the shard of `layer`.
  absl::Status MalformedBn(const std::string& layer,
                           const absl::Status& s) const;

  const PsClientOptions options_;
  const std::vector<Shard> shards_;
  proto::JobConfig config_;  // set by Connect before the client is shared
  std::atomic<uint64_t> next_bn_id_{1};

  absl::Mutex rng_mu_;
  absl::BitGen rng_ ABSL_GUARDED_BY(rng_mu_);

  absl::Mutex streams_mu_;
  std::vector<std::shared_ptr<BnStream>> streams_ ABSL_GUARDED_BY(streams_mu_);

  // The background thread: heartbeats, and cancels a BN stream whose write is
  // stuck past its caller's deadline (a server that stopped reading).
  mutable absl::Mutex bg_mu_;
  bool stopping_ ABSL_GUARDED_BY(bg_mu_) = false;
  grpc::ClientContext* heartbeat_context_ ABSL_GUARDED_BY(bg_mu_) = nullptr;
  HeartbeatStats heartbeat_stats_ ABSL_GUARDED_BY(bg_mu_);
  std::thread background_;
};

}  // namespace bnps::worker

#endif  // BNPS_WORKER_PS_CLIENT_H_
