// The gRPC client's connections to a job's shards, and what every kind of
// call shares: the call set-up (deadline, generation, and the proof of the
// job token: channel_auth.h), the deadline of a call that may wait on a
// barrier, retries with backoff, and the error context.
// Internal to client/; GrpcPsClient owns one and hands it to its parts.
//
// Thread-safety: thread-safe once set_config has been called (Connect calls
// it before the client is shared).

#ifndef BNPS_CLIENT_INTERNAL_CHANNELS_H_
#define BNPS_CLIENT_INTERNAL_CHANNELS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/grpc_options.h"
#include "client/internal/channel_auth.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/generation.h"

namespace bnps::client::internal {

// `s` with `context` in front of its message; OK stays OK.
absl::Status Annotate(const absl::Status& s, absl::string_view context);
// INVALID_ARGUMENT "malformed response from <from>: <s's message>".
absl::Status Malformed(absl::string_view from, const absl::Status& s);
// INVALID_ARGUMENT unless `key` has 1 to proto::kMaxKeyBytes bytes; `what`
// names it ("key", "BN layer").
absl::Status CheckKey(const std::string& key, absl::string_view what);
// Runs fn(0) .. fn(n - 1) on n threads (fn(0) on the caller's) and returns
// the first error in index order.
absl::Status RunParallel(int n, const std::function<absl::Status(int)>& fn);

class Channels {
 public:
  struct Shard {
    std::string address;
    // How its calls prove the token (channel_auth.h).
    std::unique_ptr<ChannelAuth> auth;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<proto::ParameterServer::Stub> stub;
    // The bulk methods, called raw (messages framed by proto/tensor_wire).
    std::unique_ptr<grpc::internal::RpcMethod> push_method;
    std::unique_ptr<grpc::internal::RpcMethod> pull_method;
  };

  // Opens one channel per server (message limits proto::kMaxMessageBytes
  // both ways, reconnect backoff from options.initial_backoff up to 2 s),
  // with TLS where `options.credentials` is set, else plaintext.
  // REQUIRES: `options` validated (ValidateOptions).
  explicit Channels(GrpcClientOptions options);

  const GrpcClientOptions& options() const { return options_; }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  const Shard& shard(int i) const { return shards_[i]; }
  // "shard 1 (host:port)".
  std::string ShardName(int shard) const;

  // The job as the servers run it; set once, before calls that wait.
  const proto::JobConfig& config() const { return config_; }
  void set_config(proto::JobConfig config) { config_ = std::move(config); }

  // The job generation this client is in (proto/bnps.proto, "Job
  // generations"), sent with every call.
  int64_t generation() const { return generation_.load(); }
  void set_generation(int64_t g) { generation_.store(g); }
  // The port of shard i's raw-TCP BN listener, as it said when this client
  // registered (RegisterResponse.bn_port); 0: none.
  int bn_port(int shard) const { return bn_ports_[shard].load(); }
  void set_bn_port(int shard, int port) { bn_ports_[shard].store(port); }
  // Shard i's BN Unix socket and the server process that offered it, as
  // it said when this client registered (RegisterResponse.bn_unix_path and
  // server_incarnation); an empty path: none.
  struct UnixSocket {
    std::string path;
    uint64_t server_incarnation = 0;
  };
  UnixSocket bn_unix_socket(int shard) const ABSL_LOCKS_EXCLUDED(paths_mu_);
  void set_bn_unix_socket(int shard, UnixSocket socket)
      ABSL_LOCKS_EXCLUDED(paths_mu_);
  // The host part of shard i's address ("dns:///h:7000" and "h:7000": "h").
  std::string Host(int shard) const;
  // Runs one call at `shard` (every call of the client goes through here):
  // attempt(context) on a fresh context with `deadline`, the generation and
  // the call's authentication (ChannelAuth: a session opened first where
  // needed, whose error is returned as is); once more if the shard refused
  // the session (a restarted server).
  template <typename Attempt>
  absl::Status Call(int shard, absl::Time deadline, Attempt attempt);

  // Deadline of a call after Connect: rpc_timeout, or the servers' barrier
  // timeout plus 5 s if that is longer, so that the server's error naming
  // the workers it waited for arrives before the client gives up.
  absl::Duration CallTimeout() const;

  // The wait before retry `retry` (0-based): initial_backoff doubling up to
  // 2 s, +-20% jitter.
  absl::Duration Backoff(int retry) ABSL_LOCKS_EXCLUDED(rng_mu_);

  // Runs attempt(context) at `shard` up to max_attempts times while it
  // fails with UNAVAILABLE or ABORTED (but not a rollback,
  // proto::IsRollback), sleeping a backoff between attempts. Each attempt
  // is a Call with a deadline CallTimeout() from its start. Once Abort has
  // been called, the attempt under way is cancelled and the call returns
  // Abort's status, as does every later call, at once.
  template <typename Attempt>
  absl::Status WithRetries(int shard, Attempt attempt)
      ABSL_LOCKS_EXCLUDED(calls_mu_);

  // Ends the calls under way in WithRetries and every later one with `why`
  // (not OK; the first one stays): a worker the job dropped has nothing
  // left to wait for, and a call at a shard it cannot reach would otherwise
  // wait out its deadline. Thread-safe.
  void Abort(absl::Status why) ABSL_LOCKS_EXCLUDED(calls_mu_);
  // Abort's status; OK before it.
  absl::Status aborted() const ABSL_LOCKS_EXCLUDED(calls_mu_);

 private:
  // Sets a call's deadline and generation.
  void SetUp(grpc::ClientContext* context, absl::Time deadline) const;
  // Adds a call's context to those Abort cancels; false (and nothing
  // added) once aborted.
  bool Register(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(calls_mu_);
  void Unregister(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(calls_mu_);
  // Sleeps `d`, or less if Abort is called meanwhile.
  void SleepUnlessAborted(absl::Duration d) ABSL_LOCKS_EXCLUDED(calls_mu_);

  static bool IsRetryable(const absl::Status& s) {
    return (s.code() == absl::StatusCode::kUnavailable ||
            s.code() == absl::StatusCode::kAborted) &&
           !proto::IsRollback(s);
  }

  const GrpcClientOptions options_;
  std::vector<Shard> shards_;
  proto::JobConfig config_;
  std::atomic<int64_t> generation_{0};
  std::unique_ptr<std::atomic<int>[]> bn_ports_;
  mutable absl::Mutex paths_mu_;
  std::vector<UnixSocket> bn_unix_sockets_ ABSL_GUARDED_BY(paths_mu_);

  absl::Mutex rng_mu_;
  absl::BitGen rng_ ABSL_GUARDED_BY(rng_mu_);

  mutable absl::Mutex calls_mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(calls_mu_);
  absl::flat_hash_set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(calls_mu_);
};

template <typename Attempt>
absl::Status Channels::Call(int shard, absl::Time deadline, Attempt attempt) {
  return shards_[shard].auth->Run(
      deadline,
      [&](grpc::ClientContext* context) { SetUp(context, deadline); },
      attempt);
}

template <typename Attempt>
absl::Status Channels::WithRetries(int shard, Attempt attempt) {
  absl::Status status;
  for (int i = 0; i < options_.max_attempts; ++i) {
    if (i > 0) SleepUnlessAborted(Backoff(i - 1));
    status = Call(shard, absl::Now() + CallTimeout(),
                  [&](grpc::ClientContext& context) {
                    if (!Register(&context)) return aborted();
                    absl::Status s = attempt(context);
                    Unregister(&context);
                    return s;
                  });
    if (!status.ok()) {
      // Cancelled by Abort (or ended some other way meanwhile): why.
      if (absl::Status a = aborted(); !a.ok()) return a;
    }
    if (status.ok() || !IsRetryable(status)) return status;
    if (options_.on_retry && i + 1 < options_.max_attempts) {
      options_.on_retry(status.code());
    }
  }
  if (options_.max_attempts > 1) {
    status = absl::Status(
        status.code(), absl::StrCat(status.message(), " (after ",
                                    options_.max_attempts, " attempts)"));
  }
  return status;
}

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_CHANNELS_H_
