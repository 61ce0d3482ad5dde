// Which shard server owns a key. Every worker and server computes the same
// answer: FNV-1a (64-bit) of the key's bytes, modulo the number of shards.
// Part of the protocol: changing it breaks every deployed job.
//
// Thread-safety: pure functions.

#ifndef BNPS_PROTO_SHARDING_H_
#define BNPS_PROTO_SHARDING_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace bnps::proto {

uint64_t Fnv1a64(absl::string_view bytes);

// REQUIRES: num_shards >= 1. Returns a shard id in [0, num_shards).
int ShardForKey(absl::string_view key, int num_shards);

}  // namespace bnps::proto

#endif  // BNPS_PROTO_SHARDING_H_
