#include "proto/sharding.h"

namespace bnps::proto {

uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

int ShardForKey(absl::string_view key, int num_shards) {
  return static_cast<int>(Fnv1a64(key) % static_cast<uint64_t>(num_shards));
}

}  // namespace bnps::proto
