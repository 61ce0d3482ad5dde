// The payload of a shard's checkpoint file (checkpoint/checkpoint.h carries
// it without looking in): the magic "BNPSST02", then records, each a
// little-endian u64 length and that many bytes: first a proto::ShardCheckpoint
// with every parameter's `values` and `momentum` left empty, then each
// parameter's values and momentum, raw, in the message's order.
//
// No protobuf message holds a tensor, so a state of any size is kept:
// protobuf serializes nothing of 2 GiB or more (SerializeAsString returns ""
// there, which once became an empty checkpoint that verified). Only the
// message without the tensors is bounded, and checked.
//
// A payload of an older server (one serialized ShardCheckpoint) still decodes.
//
// Thread-safety: stateless functions.

#ifndef BNPS_SERVER_SHARD_STATE_CODEC_H_
#define BNPS_SERVER_SHARD_STATE_CODEC_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/checkpoint.pb.h"

namespace bnps::server {

// What EncodeShardState made: `pieces`, whose concatenation is the payload,
// view `owned` and the caller's tensors (which must outlive them).
struct StatePieces {
  std::vector<std::string> owned;
  std::vector<absl::string_view> pieces;
};

// Encodes `head` (its parameters' values and momentum empty) and `tensors`
// (2 per parameter: values, then momentum) into `*out`. RESOURCE_EXHAUSTED if
// `head` serializes to more than `max_message_bytes`; INVALID_ARGUMENT if
// `tensors` does not have two per parameter.
absl::Status EncodeShardState(const proto::ShardCheckpoint& head,
                              const std::vector<absl::string_view>& tensors,
                              size_t max_message_bytes, StatePieces* out);

// The payload of a whole `checkpoint` (tensors in its fields), as above.
absl::StatusOr<std::string> EncodeShardState(
    const proto::ShardCheckpoint& checkpoint,
    size_t max_message_bytes = (size_t{1} << 31) - 1);

// The checkpoint `payload` holds (either format), tensors in their fields.
// DATA_LOSS naming `from` if it is none.
absl::StatusOr<proto::ShardCheckpoint> DecodeShardState(
    const std::string& payload, const std::string& from);

}  // namespace bnps::server

#endif  // BNPS_SERVER_SHARD_STATE_CODEC_H_
