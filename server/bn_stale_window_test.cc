#include "server/bn_stale_window.h"

#include <functional>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "bn/moments.h"
#include "gtest/gtest.h"

namespace bnps::server {
namespace {

// Worker w's moments of step t: distinct for every (w, t).
bn::Moments MomentsOf(int w, int64_t t) {
  bn::Moments m = bn::Moments::Empty(2);
  m.count = 2 + w;
  m.mean = {1.0 * w + 0.01 * t, -0.5 * w + 0.1 * t};
  m.m2 = {1.0 + 0.1 * t, 2.0 + w};
  return m;
}

struct Got {
  std::optional<absl::StatusOr<StaleWindow::Answer>> answer;
};

StaleWindow::Done Into(Got* got) {
  return [got](absl::StatusOr<StaleWindow::Answer> a) { got->answer = a; };
}

void RunReady(std::vector<std::function<void()>>* ready) {
  for (auto& fn : *ready) fn();
  ready->clear();
}

// s = 2, three workers: the first two steps with their own alone; step t
// waits until both others sent step t - 2 and then gets exactly theirs,
// merged in worker order; a worker ahead waits, one behind is answered at
// once; the kept steps stay within the window.
TEST(StaleWindowTest, StepTGetsTheOthersMomentsOfStepTMinusS) {
  StaleWindow window(3, 2, 2);
  const std::vector<bool> live(3, true);
  const std::vector<absl::Status> ok(3);
  std::vector<std::function<void()>> ready;
  Got early;
  window.Add(0, 1, MomentsOf(0, 1), absl::InfiniteFuture(), Into(&early));
  window.Evaluate(live, ok, &ready);
  RunReady(&ready);
  ASSERT_TRUE(early.answer.has_value() && early.answer->ok());
  EXPECT_EQ((*early.answer)->contributors, 0);
  EXPECT_EQ((*early.answer)->others.count, 0);

  // Worker 0 runs ahead to step 4: it needs steps 2 of workers 1 and 2.
  Got ahead;
  window.Add(0, 4, MomentsOf(0, 4), absl::InfiniteFuture(), Into(&ahead));
  window.Evaluate(live, ok, &ready);
  RunReady(&ready);
  EXPECT_FALSE(ahead.answer.has_value());
  // Workers 1 and 2 step together (worker 0's first moments are of step 1:
  // their steps 2 do not wait for its step 0).
  for (int64_t t = 0; t <= 2; ++t) {
    for (int w : {1, 2}) {
      Got g;
      window.Add(w, t, MomentsOf(w, t), absl::InfiniteFuture(), Into(&g));
      window.Evaluate(live, ok, &ready);
      RunReady(&ready);
      ASSERT_TRUE(g.answer.has_value()) << w << " " << t;
    }
  }
  ASSERT_TRUE(ahead.answer.has_value() && ahead.answer->ok());
  bn::Moments others = bn::Moments::Empty(2);
  bn::MergeInto(MomentsOf(1, 2), &others);
  bn::MergeInto(MomentsOf(2, 2), &others);
  EXPECT_EQ((*ahead.answer)->contributors, 2);
  EXPECT_EQ((*ahead.answer)->others.count, others.count);
  EXPECT_EQ((*ahead.answer)->others.mean, others.mean);
  EXPECT_EQ((*ahead.answer)->others.m2, others.m2);
  EXPECT_EQ(window.waiting(), 0);
  // Kept: from the slowest worker's newest step (2) less s on.
  EXPECT_LE(window.steps_kept(), 5);
}

// A worker whose first moments come after the target (it joined later) is
// not waited for; a lost one is skipped; a failed one fails the forwards
// that need it; a deadline names the workers waited for.
TEST(StaleWindowTest, LateJoinersLostAndFailedWorkersAndDeadlines) {
  StaleWindow window(3, 1, 2);
  std::vector<bool> live(3, true);
  std::vector<absl::Status> failed(3);
  std::vector<std::function<void()>> ready;
  Got g0, g2;
  window.Add(0, 5, MomentsOf(0, 5), absl::InfiniteFuture(), Into(&g0));
  window.Add(2, 5, MomentsOf(2, 5), absl::InfiniteFuture(), Into(&g2));
  window.Evaluate(live, failed, &ready);
  RunReady(&ready);
  // Each waits for the others' step 4; worker 2's first is step 5, so
  // worker 0 no longer waits for it; both still wait for worker 1.
  EXPECT_FALSE(g0.answer.has_value());
  live[1] = false;  // worker 1 lost
  window.Evaluate(live, failed, &ready);
  RunReady(&ready);
  ASSERT_TRUE(g0.answer.has_value() && g0.answer->ok());
  EXPECT_EQ((*g0.answer)->contributors, 0);
  ASSERT_TRUE(g2.answer.has_value() && g2.answer->ok());

  StaleWindow w2(2, 1, 2);
  std::vector<bool> both(2, true);
  std::vector<absl::Status> f2(2);
  Got a, b;
  w2.Add(0, 0, MomentsOf(0, 0), absl::InfiniteFuture(), Into(&a));
  w2.Add(1, 0, MomentsOf(1, 0), absl::InfiniteFuture(), Into(&a));
  w2.Add(0, 3, MomentsOf(0, 3), absl::InfiniteFuture(), Into(&b));
  w2.Evaluate(both, f2, &ready);
  RunReady(&ready);
  EXPECT_FALSE(b.answer.has_value());  // waits for worker 1's step 2
  f2[1] = absl::UnavailableError("worker 1 crashed");
  w2.Evaluate(both, f2, &ready);
  RunReady(&ready);
  ASSERT_TRUE(b.answer.has_value());
  EXPECT_EQ(b.answer->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(b.answer->status().message().find("worker 1"), std::string::npos);

  StaleWindow w3(2, 1, 2);
  Got c;
  w3.Add(1, 0, MomentsOf(1, 0), absl::InfiniteFuture(), Into(&c));
  w3.Add(0, 4, MomentsOf(0, 4), absl::UnixEpoch() + absl::Seconds(5),
         Into(&c));
  w3.Evaluate(both, std::vector<absl::Status>(2), &ready);
  RunReady(&ready);
  c.answer.reset();
  w3.Expire(absl::UnixEpoch() + absl::Seconds(5), "bn0", both, &ready);
  RunReady(&ready);
  ASSERT_TRUE(c.answer.has_value());
  EXPECT_EQ(c.answer->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(c.answer->status().message().find("step 3"), std::string::npos)
      << c.answer->status();
  EXPECT_NE(c.answer->status().message().find("[1]"), std::string::npos);
}

}  // namespace
}  // namespace bnps::server
