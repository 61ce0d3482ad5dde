#include "worker/dropped_watch.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace bnps::worker {
namespace {

constexpr DroppedWatch::Options kFast{absl::Milliseconds(5),
                                      absl::Milliseconds(50)};

// What the watch sees: OK until Drop().
struct Source {
  absl::Mutex mu;
  absl::Status status;
  void Drop() {
    absl::MutexLock lock(&mu);
    status = absl::FailedPreconditionError("worker 1 is no longer in the job");
  }
  absl::Status Get() {
    absl::MutexLock lock(&mu);
    return status;
  }
};

TEST(DroppedWatchTest, CallsOnDroppedOnceAfterTheGrace) {
  Source source;
  std::atomic<int> calls{0};
  absl::Notification called;
  absl::Status seen;
  DroppedWatch watch([&] { return source.Get(); },
                     [&](const absl::Status& s) {
                       seen = s;
                       ++calls;
                       called.Notify();
                     },
                     kFast);
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(calls.load(), 0);  // not dropped: nothing
  const absl::Time dropped = absl::Now();
  source.Drop();
  ASSERT_TRUE(called.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(absl::Now() - dropped, kFast.grace);
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(seen.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DroppedWatchTest, AWatchEndedWithinTheGraceCallsNothing) {
  Source source;
  std::atomic<int> calls{0};
  {
    DroppedWatch watch([&] { return source.Get(); },
                       [&](const absl::Status&) { ++calls; },
                       {absl::Milliseconds(5), absl::Seconds(30)});
    source.Drop();
    absl::SleepFor(absl::Milliseconds(30));
  }  // the trainer stopped on its own
  EXPECT_EQ(calls.load(), 0);
}

}  // namespace
}  // namespace bnps::worker
