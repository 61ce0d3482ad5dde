// The gRPC client's bulk traffic: initial values, gradient pushes and
// parameter pulls. Tensors are routed to the shards that own their keys
// (proto::ShardForKey), cut into chunks of proto::kChunkFloats floats and
// framed by proto/tensor_wire (one full chunk per message, small tensors
// packed together). Shards are called in parallel, each call retried as
// Channels::WithRetries says (the server deduplicates pushes). Internal to
// client/; GrpcPsClient's methods of the same names document the contract.
//
// Thread-safety: thread-safe. The Channels must outlive it.

#ifndef BNPS_CLIENT_INTERNAL_BULK_TRANSFER_H_
#define BNPS_CLIENT_INTERNAL_BULK_TRANSFER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/internal/channels.h"
#include "client/ps_client.h"
#include "grpcpp/client_context.h"
#include "proto/bnps.pb.h"

namespace bnps::client::internal {

// Calls PullParameters on `shard` with `request`, on `context` (which the
// caller has set up), and reads the answer to its end: each key's values go
// to `place(key)` (its shape and size are set here) and `arrived(key)` runs
// once that key is whole. A request with no keys asks for every key of the
// shard. Says how it ended: a key of another shard, one not asked for or one
// sent twice, or bytes that are not a pull's (the call is then cancelled and
// drained) as INVALID_ARGUMENT naming the shard; else the call's status;
// else a tensor cut off at the end of the stream; else NOT_FOUND for a key
// asked for and not sent; else OK.
absl::Status PullShardStream(
    Channels& channels, int shard, const proto::PullParametersRequest& request,
    grpc::ClientContext& context,
    absl::FunctionRef<Param*(const std::string& key)> place,
    absl::FunctionRef<void(const std::string& key)> arrived);

class BulkTransfer {
 public:
  explicit BulkTransfer(Channels* channels) : channels_(channels) {}

  // A gradient to push: its key and value, neither owned.
  struct PushEntry {
    const std::string* key;
    const Param* param;
  };

  absl::Status InitParameters(const Params& params);
  absl::Status PushGradients(int64_t step, int64_t num_samples,
                             const Params& grads);
  absl::Status PushGradients(int64_t step, int64_t num_samples,
                             std::shared_ptr<const Params> grads);
  // Pushes `entries` (distinct keys) as PushGradients does, referencing
  // their values if `owner` (which keeps them alive) is not null and copying
  // them otherwise.
  absl::Status PushEntries(int64_t step, int64_t num_samples,
                           const std::vector<PushEntry>& entries,
                           const std::shared_ptr<const void>& owner);
  absl::StatusOr<Params> PullParameters(const std::vector<std::string>& keys,
                                        int64_t min_version);
  absl::Status PullParametersInto(int64_t min_version, Params* params);

 private:
  absl::Status InitShard(int shard, const std::vector<const std::string*>& keys,
                         const Params& params);
  // Copies the tensors into the messages, or references them if `owner`
  // (which keeps `grads` alive) is not null.
  absl::Status PushAll(int64_t step, int64_t num_samples, const Params& grads,
                       const std::shared_ptr<const void>& owner);
  absl::Status PushShard(int shard, int64_t step, int64_t num_samples,
                         const std::vector<PushEntry>& entries,
                         const std::shared_ptr<const void>& owner,
                         grpc::ClientContext& context);
  // Where a pulled tensor goes: the entry for `key`, or nullptr if the key
  // was not requested. Called from one thread per shard at once.
  using PullSlot = std::function<Param*(int shard, const std::string& key)>;
  // Pulls `keys` (every key if empty) of `shard` into the slots.
  absl::Status PullShard(int shard, const std::vector<std::string>& keys,
                         int64_t min_version, const PullSlot& slot,
                         grpc::ClientContext& context);
  absl::Status PullFrom(
      const std::vector<std::vector<std::string>>& keys_by_shard,
      const std::vector<int>& shards, int64_t min_version,
      const PullSlot& slot);

  Channels* const channels_;  // not owned
};

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_BULK_TRANSFER_H_
