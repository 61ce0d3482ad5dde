// A shard state over 2 GiB, for real (manual: it needs about 9 GiB of
// memory, 2.5 GB of disk, 2.5 minutes): three parameters of 100M floats
// with momentum -- 2.4 GB of state, more than protobuf's 2 GiB message
// limit -- are checkpointed at a step boundary, and a shard created on the
// directory restores them: every value and momentum bit for bit. The unit
// test of the same path lowers the message limit instead
// (server/shard_checkpoint_test: AStateOfAnySizeRoundTrips).
//
//   bazel test //tests:large_state_test --test_output=streamed
//
// prints the checkpoint's size, the time of each part and the peak memory.

#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint.h"
#include "gtest/gtest.h"
#include "proto/sharding.h"
#include "server/shard.h"

namespace bnps {
namespace {

constexpr int kKeys = 3;
constexpr int64_t kFloats = 100'000'000;  // per key: 400 MB of values

// A hash of every value and momentum of the shard, in key order.
uint64_t StateHash(const server::Shard& shard, int64_t* bytes) {
  const store::StoreState state = shard.store().Export();
  uint64_t h = 0;
  *bytes = 0;
  for (const store::StoreState::Key& k : state.keys) {
    const absl::string_view v(reinterpret_cast<const char*>(k.values->data()),
                              k.values->size() * sizeof(float));
    const absl::string_view m(reinterpret_cast<const char*>(k.momentum.data()),
                              k.momentum.size() * sizeof(float));
    h = h * 1099511628211ull ^ proto::Fnv1a64(v);
    h = h * 1099511628211ull ^ proto::Fnv1a64(m);
    *bytes += static_cast<int64_t>(v.size() + m.size());
  }
  return h;
}

double PeakGiB() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1048576.0;  // ru_maxrss is in KiB
}

TEST(LargeStateTest, AStateOver2GiBRoundTripsThroughACheckpoint) {
  const char* tmp = getenv("TEST_TMPDIR");
  std::string tmpl = std::string(tmp != nullptr ? tmp : "/tmp") +
                     "/large_state_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  server::ShardOptions o;
  o.num_workers = 1;
  o.policy = policy::Policy::kSync;
  o.start_ticker = false;
  o.checkpoint_dir = dir;
  o.checkpoint_every = 1;
  o.optimizer.learning_rate = 0.1;
  o.optimizer.momentum = 0.9;
  uint64_t before = 0;
  int64_t state_bytes = 0;
  absl::Time t0 = absl::Now();
  {
    auto shard = *server::Shard::Create(o);
    ASSERT_TRUE(shard->Register(0, 7).ok());
    for (int k = 0; k < kKeys; ++k) {
      std::vector<float> init(kFloats);
      for (int64_t i = 0; i < kFloats; ++i) init[i] = 0.001f * (i % 4099) + k;
      ASSERT_TRUE(*shard->store().Init("p" + std::to_string(k), {kFloats},
                                       std::move(init)));
    }
    for (int k = 0; k < kKeys; ++k) {  // step 0: the boundary of step 1
      std::vector<float> g(kFloats);
      for (int64_t i = 0; i < kFloats; ++i) g[i] = 0.5f - 0.0001f * (i % 7919);
      ASSERT_TRUE(shard->store()
                      .Push(0, 0, "p" + std::to_string(k), {kFloats}, g, 1)
                      .ok());
    }
    ASSERT_TRUE(shard->FlushCheckpoints().ok());
    before = StateHash(*shard, &state_bytes);
  }
  const absl::Duration wrote = absl::Now() - t0;
  struct stat st;
  ASSERT_EQ(::stat(checkpoint::CheckpointPath(dir, 1).c_str(), &st), 0);
  EXPECT_GT(state_bytes, int64_t{1} << 31);
  EXPECT_GT(st.st_size, int64_t{1} << 31);
  t0 = absl::Now();
  {
    auto restarted = *server::Shard::Create(o);
    EXPECT_EQ(restarted->generation().restored_step, 1);
    int64_t restored_bytes = 0;
    EXPECT_EQ(StateHash(*restarted, &restored_bytes), before);
    EXPECT_EQ(restored_bytes, state_bytes);
  }
  const absl::Duration restored = absl::Now() - t0;
  std::printf(
      "| state | checkpoint file | init + step + write | restore + check | "
      "peak RSS |\n|---|---|---|---|---|\n| %.2f GB | %.2f GB | %.1f s | "
      "%.1f s | %.1f GiB |\n",
      state_bytes / 1e9, st.st_size / 1e9, absl::ToDoubleSeconds(wrote),
      absl::ToDoubleSeconds(restored), PeakGiB());
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace bnps
