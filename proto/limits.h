// Size limits of the protocol, set explicitly on clients and servers.

#ifndef BNPS_PROTO_LIMITS_H_
#define BNPS_PROTO_LIMITS_H_

#include <cstdint>

namespace bnps::proto {

// Largest gRPC message either side sends or accepts.
inline constexpr int kMaxMessageBytes = 8 << 20;
// Tensors are cut into chunks of at most this many bytes of payload.
inline constexpr int64_t kChunkBytes = 1 << 20;
inline constexpr int64_t kChunkFloats = kChunkBytes / 4;
// Gradient pushes and parameter pulls are cut into messages of at most this
// many bytes: one full chunk each, or many small tensors together. A receiver
// then checks and stages a chunk while the next is still on the wire; with
// 4 MB messages it waited for four chunks at a time, and push + pull of 64 MB
// over one shard ran about a tenth slower (measured in ps_benchmark's
// gradient table when this was chosen; see the commit that set it).
inline constexpr int64_t kBulkMessageBytes = kChunkBytes + 4096;
// Largest tensor a parameter or gradient may be (elements).
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 30;
// Most channels a BN layer may have.
inline constexpr int64_t kMaxChannels = int64_t{1} << 20;
// Longest key.
inline constexpr int kMaxKeyBytes = 256;

}  // namespace bnps::proto

#endif  // BNPS_PROTO_LIMITS_H_
