#include "util/keep_awake.h"

#include <sched.h>

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/eventually.h"

namespace bnps::util {
namespace {

using ::testing::HasSubstr;

int FirstAllowedCpu() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  EXPECT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mask)) return cpu;
  }
  return -1;
}

TEST(KeepAwakeTest, RefusesBadArguments) {
  absl::StatusOr<std::unique_ptr<KeepAwake>> k =
      KeepAwake::Start(absl::ZeroDuration());
  EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument);
  k = KeepAwake::Start(absl::Milliseconds(1), {CPU_SETSIZE + 5});
  EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(k.status().message(), HasSubstr("affinity mask"));
}

TEST(KeepAwakeTest, OneIdlePriorityThreadPerCpuOfTheMask) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
  absl::StatusOr<std::unique_ptr<KeepAwake>> k =
      KeepAwake::Start(absl::Milliseconds(5));
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(static_cast<int>((*k)->cpus().size()), CPU_COUNT(&mask));
  for (int tid : (*k)->thread_ids()) {
    ASSERT_GT(tid, 0);
    EXPECT_EQ(sched_getscheduler(tid), SCHED_IDLE) << "thread " << tid;
    cpu_set_t pinned;
    CPU_ZERO(&pinned);
    ASSERT_EQ(sched_getaffinity(tid, sizeof pinned, &pinned), 0);
    EXPECT_EQ(CPU_COUNT(&pinned), 1) << "thread " << tid;
  }
}

TEST(KeepAwakeTest, BusyAfterATouchAndAsleepOnceTheHoldPasses) {
  const int cpu = FirstAllowedCpu();
  ASSERT_GE(cpu, 0);
  absl::StatusOr<std::unique_ptr<KeepAwake>> started =
      KeepAwake::Start(absl::Milliseconds(20), {cpu, cpu});
  ASSERT_TRUE(started.ok()) << started.status();
  KeepAwake& k = **started;
  ASSERT_EQ(k.cpus(), std::vector<int>{cpu});  // duplicates dropped
  // Untouched, the thread sleeps and accrues no busy time.
  ASSERT_TRUE(Eventually([&] { return k.sleeping() == 1; }));
  EXPECT_EQ(k.busy(), absl::ZeroDuration());

  // A touch wakes it; it busy-waits for about the hold, then sleeps again.
  k.Touch();
  ASSERT_TRUE(Eventually([&] { return k.busy() > absl::ZeroDuration(); }));
  ASSERT_TRUE(Eventually([&] { return k.sleeping() == 1; }));
  const absl::Duration after_one = k.busy();
  EXPECT_LE(after_one, absl::Seconds(5));

  // Touches that keep coming keep it busy past a single hold.
  const absl::Time end = absl::Now() + absl::Milliseconds(100);
  while (absl::Now() < end) {
    k.Touch();
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_TRUE(Eventually([&] { return k.sleeping() == 1; }));
  EXPECT_GT(k.busy() - after_one, absl::Milliseconds(20));
}

TEST(KeepAwakeTest, StopsWhileBusy) {
  absl::StatusOr<std::unique_ptr<KeepAwake>> k =
      KeepAwake::Start(absl::Hours(1));
  ASSERT_TRUE(k.ok()) << k.status();
  (*k)->Touch();
  ASSERT_TRUE(
      Eventually([&] { return (*k)->sleeping() == 0; }));
  k->reset();  // joins: must not wait for the hour
}

TEST(KeepAwakeTest, ConcurrentTouchesFromManyThreads) {
  absl::StatusOr<std::unique_ptr<KeepAwake>> k =
      KeepAwake::Start(absl::Microseconds(50));
  ASSERT_TRUE(k.ok()) << k.status();
  std::vector<std::thread> touchers;
  for (int t = 0; t < 4; ++t) {
    touchers.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        (*k)->Touch();
        if (i % 100 == 0) absl::SleepFor(absl::Microseconds(200));
      }
    });
  }
  for (std::thread& t : touchers) t.join();
  const int n = static_cast<int>((*k)->cpus().size());
  EXPECT_TRUE(Eventually([&] { return (*k)->sleeping() == n; }));
}

}  // namespace
}  // namespace bnps::util
