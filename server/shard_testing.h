// What the Shard tests share: a bulk-synchronous step of one parameter "w"
// of shape {2} from every worker, and its values.

#ifndef BNPS_SERVER_SHARD_TESTING_H_
#define BNPS_SERVER_SHARD_TESTING_H_

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "server/shard.h"

namespace bnps::server::shard_testing {

// Every worker of `step` (the shard's membership) pushes {g, -g} of "w",
// one sample each.
inline void Step(Shard& shard, int64_t step, float g) {
  for (int w = 0; w < shard.history().WorkersAt(step); ++w) {
    absl::StatusOr<store::ParameterStore::PushResult> r =
        shard.store().Push(w, step, "w", {2}, std::vector<float>{g, -g}, 1);
    ASSERT_TRUE(r.ok()) << r.status();
  }
}

// The values of "w" now.
inline std::vector<float> Values(Shard& shard) {
  std::vector<float> out;
  shard.store().Pull({"w"}, 0, absl::InfiniteFuture(),
                     [&](absl::StatusOr<store::ParameterStore::Snapshot> s) {
                       ASSERT_TRUE(s.ok()) << s.status();
                       out = *s->at("w").values;
                     });
  return out;
}

}  // namespace bnps::server::shard_testing

#endif  // BNPS_SERVER_SHARD_TESTING_H_
