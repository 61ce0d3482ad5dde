// JobReader: reads a job's shard servers without joining the job -- their
// status, the digest of their state, and every parameter and BN layer's
// running statistics (the read-only ReadState call). It registers nothing
// and heartbeats nothing, so it may connect at any time: while the job
// trains, after its workers left (a complete job's servers serve their
// final state), or to a server restarted from its final checkpoint. Every
// call proves the job token when there is one (client/internal/
// channel_auth.h: a session without TLS, the token over TLS). bnps_status and the
// Python export (bnps.export) read through it.
//
// Example:
//   JobReaderOptions options;
//   options.servers = {"ps0:7000", "ps1:7000"};
//   absl::StatusOr<std::unique_ptr<JobReader>> reader =
//       JobReader::Create(options);
//   absl::StatusOr<JobState> state = (*reader)->ReadState();
//
// Errors: INVALID_ARGUMENT for bad options and malformed answers ("shard N
// (address): ..."); otherwise the status a server gave (UNAVAILABLE for one
// that cannot be reached within the timeout, UNAUTHENTICATED for a wrong
// token), its message prefixed with the call and the shard.
//
// Thread-safety: thread-safe.

#ifndef BNPS_CLIENT_JOB_READER_H_
#define BNPS_CLIENT_JOB_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bn/kernels.h"
#include "client/ps_client.h"
#include "proto/bnps.pb.h"

namespace grpc {
class ChannelCredentials;
class ClientContext;
}  // namespace grpc

namespace bnps::client {

struct JobReaderOptions {
  // host:port of every shard server, shard 0 first; at least one.
  std::vector<std::string> servers;
  std::string job = "bnps";  // Default: "bnps"
  // TLS or mutual TLS (security/credentials.h); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string token;  // the job token; empty: none
  // Each call's deadline. Default: 30 s.
  absl::Duration timeout = absl::Seconds(30);
  // Wait up to the timeout for a server that cannot be reached (still
  // starting, restarting) instead of failing with UNAVAILABLE at once.
  // Default: false.
  bool wait_for_ready = false;
};

// What a job's servers hold, read at one moment per shard.
struct JobState {
  Params params;  // every parameter of the job, by key
  // Every BN layer that has running statistics, by layer name.
  std::map<std::string, bn::RunningStats> running;
  int64_t step = 0;  // the smallest parameter version over the shards
  bool job_complete = false;  // every shard says the job is complete
};

// bnps_status --digest's line: a SHA-256 over every shard's (key, hash)
// pairs in key order (proto::DigestResponse), and the smallest version.
struct JobDigest {
  std::string sha256_hex;
  int64_t step = 0;
};

namespace internal {
class ChannelAuth;
}  // namespace internal

class JobReader {
 public:
  ~JobReader();

  // INVALID_ARGUMENT without servers, or with an empty job name. Connects
  // nothing yet.
  static absl::StatusOr<std::unique_ptr<JobReader>> Create(
      JobReaderOptions options);

  int num_shards() const { return static_cast<int>(options_.servers.size()); }
  const JobReaderOptions& options() const { return options_; }

  // What shard `shard` knows (GetStatus). INVALID_ARGUMENT for a shard out
  // of range; a failed call's status as it is, not prefixed (the caller
  // names the shard, as bnps_status's view does).
  absl::StatusOr<proto::StatusResponse> GetStatus(int shard) const;
  // The digest of every shard (GetDigest), as bnps_status --digest prints.
  absl::StatusOr<JobDigest> GetDigest() const;
  // Every shard's parameters and running statistics (ReadState).
  absl::StatusOr<JobState> ReadState() const;

 private:
  explicit JobReader(JobReaderOptions options);
  // Runs attempt(context) at `shard` with the call's deadline and
  // authentication (internal::ChannelAuth::Run).
  template <typename Attempt>
  absl::Status Call(int shard, Attempt attempt) const;
  std::string ShardName(int shard) const;
  // Shard `shard`'s ReadState, added to `*state`.
  absl::Status ReadShard(int shard, JobState* state) const;
  // ReadShard's call.
  absl::Status ReadStream(int shard, grpc::ClientContext& context,
                          JobState* state) const;

  const JobReaderOptions options_;
  // How each shard's calls prove the token.
  std::vector<std::unique_ptr<internal::ChannelAuth>> auth_;
  // Each shard's gRPC stub (job_reader.cc: the generated service header
  // stays out of this one).
  struct Stubs;
  std::unique_ptr<Stubs> stubs_;
};

}  // namespace bnps::client

#endif  // BNPS_CLIENT_JOB_READER_H_
