// How GrpcPsClient (client/grpc_ps_client.h) reaches a job's shard servers,
// and the counters of its heartbeat.

#ifndef BNPS_CLIENT_GRPC_OPTIONS_H_
#define BNPS_CLIENT_GRPC_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "proto/bnps.pb.h"

// Declared, not included: the gRPC headers cost every file that includes
// this one seconds of compile time (security/credentials.h makes them).
namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace bnps::client {

struct GrpcClientOptions {
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
  // The host this worker runs on, sent when it registers
  // (RegisterRequest.host): under --bn_group=host the workers of one host
  // form a BN group. Name it where several machines share a host name, or
  // one machine's workers have several (containers: its node's name).
  // Default: empty (this machine's host name).
  std::string host;
  // How long Connect may take in all: registration with every shard,
  // retrying UNAVAILABLE (a server not up yet, a closed port, a wrong host)
  // with backoff. A shard not reached by then fails Connect with an error
  // naming its address. Kept apart from rpc_timeout so that a wrong address
  // shows soon while calls of a running job may wait long. Must be finite
  // and positive.
  // Default: 30 s.
  absl::Duration connect_timeout = absl::Seconds(30);
  // Deadline of every call attempt (in Connect, at most what is left of
  // connect_timeout) and of each BN call (its retry included).
  // Calls that may wait on the servers' barriers (BN, pulls of a version,
  // StartStep) wait at least the servers' barrier_timeout_ms plus 5 s, so
  // the server's error naming the missing workers arrives first. Must be
  // finite and positive.
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
  // A push in parts (StartPush) sends the parts it was given once they hold
  // at least this many bytes of gradients, and the rest in Finish: each
  // send is a call per shard whose fixed cost (a few hundred microseconds
  // here) only pays off when there is enough to send while the caller
  // computes. 0 sends every part as it comes. >= 0.
  // Default: 1 MiB.
  int64_t push_part_bytes = int64_t{1} << 20;
  // Channel credentials, e.g. from security::MakeChannelCredentials for TLS.
  // Default: nullptr, meaning grpc::InsecureChannelCredentials().
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // The job token (security/job_token.h), sent with every call; empty: none.
  // Default: empty.
  std::string token;
  // More of the job's config that this worker needs (say, the policy it was
  // launched for). Connect calls it with the config every shard agreed on,
  // before registering anywhere; an error stops Connect, returned as is, and
  // the worker never joins the job.
  // Default: none (any config the servers agree on).
  std::function<absl::Status(const proto::JobConfig&)> check_config;
  // Called before each retry of a call (not of Connect's registration) with
  // the code the failed attempt ended with, e.g. to count retries in
  // metrics. May be called from several threads at once.
  // Default: none.
  std::function<void(absl::StatusCode)> on_retry;
  // Called after each BnForward (backward false) and BnBackward (true)
  // that got its answer, with the layer and the call's wall time, on the
  // caller's thread: e.g. to observe BN round trips in metrics where the
  // caller does not time them itself (the C ABI; bnps_worker times them as
  // its model sees them). Failed calls are not observed (a refused layer
  // name would become a label). May be called from several threads at
  // once.
  // Default: none.
  std::function<void(const std::string& layer, bool backward,
                     absl::Duration took)>
      on_bn_call;
  // How long a BN call polls for its answer without sleeping before it
  // blocks (once per event it waits for). Spinning saves the wake-up of a
  // blocked thread (tens of microseconds a round trip) and keeps the core
  // busy meanwhile: worth it only where the worker has a core to itself
  // (bnps_worker --bn_spin_us decides). Must be >= 0.
  // Default: 0 (block at once).
  absl::Duration bn_spin = absl::ZeroDuration();
  // bn_spin from a count of microseconds, as bnps_worker --bn_spin_us and
  // the C ABI take it: 0 to 1,000,000, or -1 for 1000 us where this machine
  // has a core for each of the job's `job_cores` busy threads (workers x
  // model threads x replicas + servers, as if all ran here), else none.
  // INVALID_ARGUMENT for other values.
  // -1's poll: long enough that a worker at a barrier is rarely put to
  // sleep by a partner a few hundred microseconds behind (on one GPU under
  // MPS, 4 workers: sync / local 1.11 with it against 1.23 with 100 us).
  static constexpr int64_t kBnSpinDefaultUs = 1000;
  static absl::StatusOr<absl::Duration> BnSpinFromUs(int64_t spin_us,
                                                     int64_t job_cores);
  // Send BN traffic over raw TCP to the servers that offer it (bnps_server
  // --bn_port; bnps.proto, BnHello): the same messages and the same
  // exactly-once, faster per exchange than the gRPC stream.
  // A server that offers none, or a connection that cannot be made, leaves
  // that shard's BN traffic on the gRPC stream; a call whose connection
  // breaks is repeated on the stream. Only for plaintext jobs: with
  // `credentials` set, BN traffic always stays on the (encrypted) stream.
  // Default: true.
  bool bn_over_tcp = true;
  // With bn_over_tcp: where a server also offers a Unix socket (bnps_server
  // --bn_unix_socket; RegisterResponse.bn_unix_path), connect there first:
  // it succeeds only on the server's host, and a round trip over it costs
  // about half one over loopback TCP. Any failure (no such path, refused,
  // no permission) falls back to TCP. Not with bn_host_aggregator.
  // Default: true.
  bool bn_unix = true;
  // With bn_over_tcp: "host:port" of this host's BN aggregator
  // (bnps_host_bn, hostbn/aggregator.h), which carries the BN traffic of
  // the host's workers to each shard as one frame per layer, phase and
  // step, with the same results. The raw-TCP connection of every shard goes
  // there, its hello naming the shard's BN address; the fallbacks are as
  // above. Default: empty (each shard directly).
  std::string bn_host_aggregator;
};

inline absl::StatusOr<absl::Duration> GrpcClientOptions::BnSpinFromUs(
    int64_t spin_us, int64_t job_cores) {
  if (spin_us < -1 || spin_us > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bn_spin_us must be in [-1, 1000000], not ", spin_us));
  }
  if (spin_us >= 0) return absl::Microseconds(spin_us);
  const int64_t cores = std::thread::hardware_concurrency();
  return cores >= job_cores ? absl::Microseconds(kBnSpinDefaultUs)
                             : absl::ZeroDuration();
}

// Counters of GrpcPsClient's background heartbeat.
struct HeartbeatStats {
  int64_t sent = 0;         // Heartbeat calls made (to all shards)
  int64_t failed = 0;       // of which failed; fatal only as `dropped` says
  absl::Status last_error;  // the most recent failure, annotated; OK if none
  // Workers live according to shard 0's latest answer.
  std::vector<int> live_workers;
  // FAILED_PRECONDITION once a shard answered that it no longer counts this
  // process as the worker (it was lost, or another process took its place);
  // every later call of the client then fails with it. OK until then.
  absl::Status dropped;
  // Other shards' losses carried to a shard that did not list them yet
  // (proto's WorkerLoss), counted per shard told.
  int64_t losses_relayed = 0;
};

// OK if `options` can be used; INVALID_ARGUMENT naming the first bad field.
absl::Status ValidateOptions(const GrpcClientOptions& options);

}  // namespace bnps::client

#endif  // BNPS_CLIENT_GRPC_OPTIONS_H_
