// The BN stream's messages (BnRequest, BnResponse) framed and parsed by hand,
// so that statistics move between the caller's vectors and gRPC's buffers
// with one copy each way: protobuf's generated classes would take two (vector
// to string to slice, and back), each with its allocations.
//
// The bytes are protobuf's wire format for these messages, so a peer that uses
// the generated classes reads and writes the same messages. A message is
// framed as its head (every field but the statistics, serialized by protobuf)
// followed by the statistics; the parser accepts any field order, packed or
// unpacked shapes, repeated messages (merged, as protobuf merges them), and
// skips unknown fields.
//
// Thread-safety: functions are pure.

#ifndef BNPS_PROTO_BN_WIRE_H_
#define BNPS_PROTO_BN_WIRE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/bnps.pb.h"
#include "proto/codec.h"

namespace bnps::proto {

// The field numbers under which a BN message keeps its statistics.
struct BnStatsFields {
  int moments;
  int sums;
  int running;
};
inline constexpr BnStatsFields kBnRequestStats{BnRequest::kMomentsFieldNumber,
                                               BnRequest::kSumsFieldNumber,
                                               BnRequest::kRunningFieldNumber};
inline constexpr BnStatsFields kBnResponseStats{
    BnResponse::kMomentsFieldNumber, BnResponse::kSumsFieldNumber,
    BnResponse::kRunningFieldNumber};

// The statistics a message carries out; null ones are left out.
struct BnStatsOut {
  const bn::Moments* moments = nullptr;
  const bn::BackwardSums* sums = nullptr;
  const bn::RunningStats* running = nullptr;
};

// The statistics of a message as they arrived, not yet checked: decode each
// with DecodeMoments, DecodeSums or DecodeRunning (proto/codec.h). One that
// was absent is all defaults, and fails to decode as an empty message does.
struct BnStatsIn {
  WireMoments moments;
  WireSums sums;
  WireRunning running;
};

// One slice: `head`'s fields (its statistics fields should be unset), then
// `stats` under `fields`, each as a float64 tensor per array.
grpc::Slice FrameBn(const google::protobuf::MessageLite& head,
                    BnStatsFields fields, const BnStatsOut& stats);

// Field 1 (`id`, in both BnRequest and BnResponse) set to `id`: put in front
// of a message framed with its id unset, it sets the id without framing the
// message again.
grpc::Slice FrameBnId(uint64_t id);
// The most bytes FrameBnId writes: a 1-byte tag and a 10-byte varint.
inline constexpr size_t kMaxBnIdBytes = 11;

// Reads `message`: the statistics under `fields` into `stats` (reset first),
// every other field into `head` (cleared first). INVALID_ARGUMENT if the
// bytes are not such a message.
absl::Status ParseBn(const grpc::ByteBuffer& message, BnStatsFields fields,
                     google::protobuf::MessageLite* head, BnStatsIn* stats);

// The id (field 1) of a BN message, skipping everything else unread (0 if it
// has none, as protobuf reads it); INVALID_ARGUMENT for malformed bytes.
absl::StatusOr<uint64_t> PeekBnId(const grpc::ByteBuffer& message);

}  // namespace bnps::proto

#endif  // BNPS_PROTO_BN_WIRE_H_
