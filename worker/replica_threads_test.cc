#include "worker/replica_threads.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace bnps::worker {
namespace {

TEST(ReplicaThreadsTest, EveryIndexRunsOncePerRunOnTheSameThreads) {
  std::atomic<int> inits{0};
  ReplicaThreads threads(3, [&](int) { ++inits; });
  absl::Mutex mu;
  std::vector<std::set<std::thread::id>> ids(3);
  for (int run = 0; run < 50; ++run) {
    std::vector<int> count(3, 0);
    threads.Run([&](int i) {
      absl::MutexLock lock(&mu);
      ++count[i];
      ids[i].insert(std::this_thread::get_id());
    });
    // Run returned: every index ran exactly once.
    EXPECT_EQ(count, (std::vector<int>{1, 1, 1})) << "run " << run;
  }
  EXPECT_EQ(inits.load(), 2);  // once per extra thread
  EXPECT_EQ(*ids[0].begin(), std::this_thread::get_id());
  for (int i = 1; i < 3; ++i) EXPECT_EQ(ids[i].size(), 1u);  // kept alive
  EXPECT_NE(*ids[1].begin(), *ids[2].begin());
}

TEST(ReplicaThreadsTest, OneReplicaRunsOnTheCaller) {
  ReplicaThreads threads(1, nullptr);
  std::thread::id ran;
  threads.Run([&](int i) {
    EXPECT_EQ(i, 0);
    ran = std::this_thread::get_id();
  });
  EXPECT_EQ(ran, std::this_thread::get_id());
}

}  // namespace
}  // namespace bnps::worker
