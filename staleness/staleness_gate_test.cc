#include "staleness/staleness_gate.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bnps::staleness {
namespace {

using ::testing::HasSubstr;

// Generous: only reached if the gate is broken.
constexpr absl::Duration kLongWait = absl::Seconds(5);

std::unique_ptr<StalenessGate> MakeGate(int workers, int64_t staleness) {
  absl::StatusOr<std::unique_ptr<StalenessGate>> gate =
      StalenessGate::Create(workers, staleness);
  EXPECT_TRUE(gate.ok()) << gate.status();
  return *std::move(gate);
}

TEST(StalenessGateTest, CreateRejectsBadArguments) {
  EXPECT_EQ(StalenessGate::Create(0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StalenessGate::Create(2, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StalenessGateTest, DoesNotWaitWhenAllowed) {
  auto gate = MakeGate(3, 1);
  // A deadline in the past: only an immediate answer can be OK.
  EXPECT_TRUE(gate->WaitToStart(0, 0, absl::InfinitePast()).ok());
  EXPECT_TRUE(gate->WaitToStart(0, 1, absl::InfinitePast()).ok());
  ASSERT_TRUE(gate->Advance(0, 2).ok());
  EXPECT_EQ(gate->WaitToStart(0, 2, absl::InfinitePast()).code(),
            absl::StatusCode::kDeadlineExceeded);

  auto single = MakeGate(1, 0);
  for (int64_t c = 0; c < 20; ++c) {
    ASSERT_TRUE(single->WaitToStart(0, c, absl::InfinitePast()).ok());
    ASSERT_TRUE(single->Advance(0, c + 1).ok());
  }
}

TEST(StalenessGateTest, BadOrRemovedWorkerFailsAtOnce) {
  auto gate = MakeGate(2, 0);
  EXPECT_EQ(gate->WaitToStart(2, 0, absl::Now() + kLongWait).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gate->WaitToStart(-1, 0, absl::Now() + kLongWait).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(gate->Remove(1).ok());
  EXPECT_EQ(gate->WaitToStart(1, 0, absl::Now() + kLongWait).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StalenessGateTest, DeadlineNamesTheLaggard) {
  auto gate = MakeGate(3, 0);
  ASSERT_TRUE(gate->Advance(0, 1).ok());
  ASSERT_TRUE(gate->Advance(2, 1).ok());
  // Worker 1 never advances.
  absl::Status status =
      gate->WaitToStart(0, 1, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()), HasSubstr("worker 1 at clock 0"));
  EXPECT_THAT(std::string(status.message()),
              ::testing::Not(HasSubstr("worker 2 at")));
}

TEST(StalenessGateTest, AdvanceWakesWaiter) {
  auto gate = MakeGate(2, 0);
  ASSERT_TRUE(gate->Advance(0, 1).ok());
  absl::Status status = absl::UnknownError("not run");
  std::thread waiter(
      [&] { status = gate->WaitToStart(0, 1, absl::Now() + kLongWait); });
  absl::SleepFor(absl::Milliseconds(10));  // usually lets it block first
  ASSERT_TRUE(gate->Advance(1, 1).ok());
  waiter.join();
  EXPECT_TRUE(status.ok()) << status;
}

TEST(StalenessGateTest, RemovingTheLaggardWakesWaiter) {
  auto gate = MakeGate(3, 1);
  ASSERT_TRUE(gate->Advance(0, 2).ok());
  ASSERT_TRUE(gate->Advance(1, 1).ok());
  absl::Status status = absl::UnknownError("not run");
  std::thread waiter(
      [&] { status = gate->WaitToStart(0, 2, absl::Now() + kLongWait); });
  absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(gate->Remove(2).ok());  // worker 2 (clock 0) is dropped
  waiter.join();
  EXPECT_TRUE(status.ok()) << status;
}

TEST(StalenessGateTest, RemovingTheWaiterEndsItsWait) {
  auto gate = MakeGate(2, 0);
  ASSERT_TRUE(gate->Advance(0, 1).ok());
  absl::Status status = absl::UnknownError("not run");
  std::thread waiter(
      [&] { status = gate->WaitToStart(0, 1, absl::Now() + kLongWait); });
  absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(gate->Remove(0).ok());
  waiter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
}

TEST(StalenessGateTest, CancelWakesAllWaiters) {
  auto gate = MakeGate(3, 0);
  ASSERT_TRUE(gate->Advance(0, 1).ok());
  ASSERT_TRUE(gate->Advance(1, 1).ok());
  std::vector<absl::Status> statuses(2, absl::UnknownError("not run"));
  std::vector<std::thread> waiters;
  for (int w = 0; w < 2; ++w) {
    waiters.emplace_back([&, w] {
      statuses[w] = gate->WaitToStart(w, 1, absl::Now() + kLongWait);
    });
  }
  absl::SleepFor(absl::Milliseconds(10));
  gate->Cancel();
  for (std::thread& t : waiters) t.join();
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  }
  EXPECT_TRUE(gate->cancelled());
  // Later waits are cancelled too, even ones the bound would allow.
  EXPECT_EQ(gate->WaitToStart(2, 0, absl::Now() + kLongWait).code(),
            absl::StatusCode::kCancelled);
  // Bookkeeping still works.
  EXPECT_TRUE(gate->Advance(2, 1).ok());
  EXPECT_EQ(gate->MinLiveClock(), 1);
}

TEST(StalenessGateTest, SnapshotAccessors) {
  auto gate = MakeGate(2, 1);
  ASSERT_TRUE(gate->Advance(1, 2).ok());
  ASSERT_TRUE(gate->Remove(0).ok());
  EXPECT_EQ(gate->num_workers(), 2);
  EXPECT_EQ(gate->staleness(), 1);
  EXPECT_EQ(gate->num_live(), 1);
  EXPECT_FALSE(gate->IsLive(0));
  EXPECT_EQ(gate->clock(1), 2);
  EXPECT_EQ(gate->MinLiveClock(), 2);
  EXPECT_TRUE(gate->MayStart(1, 3));
  EXPECT_TRUE(gate->Admissible(1, 2));
  EXPECT_FALSE(gate->Admissible(0, 2));
  ClockTable snapshot = gate->Snapshot();
  EXPECT_EQ(snapshot.clock(1), 2);
  EXPECT_EQ(snapshot.num_live(), 1);
}

// W threads run `steps` steps each under the gate with random short sleeps. The
// test's own record of completed work is updated before the gate hears of it, so
// it is never behind the gate; every start is checked against it.
struct Record {
  int worker;
  int64_t step;
  int64_t min_completed;  // over live workers, when the step began
};

void RunWorkers(int workers, int64_t s, int steps, uint32_t seed,
                int remove_worker, int remove_after) {
  SCOPED_TRACE(testing::Message() << "W=" << workers << " s=" << s
                                  << " seed=" << seed);
  auto gate = MakeGate(workers, s);
  absl::Mutex mu;
  std::vector<int64_t> completed(workers, 0);
  std::vector<bool> live(workers, true);
  std::vector<Record> records;
  auto min_live = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    int64_t min = ClockTable::kNoLiveWorkers;
    for (int w = 0; w < workers; ++w) {
      if (live[w]) min = std::min(min, completed[w]);
    }
    return min;
  };

  std::vector<absl::Status> results(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(seed * 31 + w);
      // Worker 0 is the slow one, to make the others wait.
      std::uniform_int_distribution<int> sleep_us(0, w == 0 ? 3000 : 1000);
      for (int64_t c = 0; c < steps; ++c) {
        if (w == remove_worker && c == remove_after) {
          {
            absl::MutexLock lock(&mu);
            live[w] = false;
          }
          results[w] = gate->Remove(w);
          return;
        }
        absl::Status status = gate->WaitToStart(w, c, absl::Now() + kLongWait);
        if (!status.ok()) {
          results[w] = status;
          return;
        }
        {
          absl::MutexLock lock(&mu);
          records.push_back({w, c, min_live()});
        }
        absl::SleepFor(absl::Microseconds(sleep_us(rng)));
        {
          absl::MutexLock lock(&mu);
          completed[w] = c + 1;
        }
        if (status = gate->Advance(w, c + 1); !status.ok()) {
          results[w] = status;
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();

  for (int w = 0; w < workers; ++w) EXPECT_TRUE(results[w].ok()) << results[w];
  for (const Record& r : records) {
    EXPECT_GE(r.min_completed, r.step - s)
        << "worker " << r.worker << " began step " << r.step;
  }
  int64_t expected_starts = static_cast<int64_t>(workers) * steps;
  if (remove_worker >= 0) expected_starts -= steps - remove_after;
  EXPECT_EQ(static_cast<int64_t>(records.size()), expected_starts);
  EXPECT_EQ(gate->MinLiveClock(), steps);
}

TEST(StalenessGateTest, ThreadsNeverBreakTheBound) {
  uint32_t seed = 1;
  for (int workers : {1, 2, 4}) {
    for (int64_t s : {0, 1, 3}) {
      RunWorkers(workers, s, /*steps=*/12, seed++, /*remove_worker=*/-1,
                 /*remove_after=*/0);
    }
  }
}

TEST(StalenessGateTest, ThreadsGoOnWhenTheSlowWorkerIsRemoved) {
  // Worker 0 (the slow one) leaves after 4 steps; the others must finish.
  for (int64_t s : {0, 2}) {
    RunWorkers(/*workers=*/3, s, /*steps=*/12, /*seed=*/7 + s,
               /*remove_worker=*/0, /*remove_after=*/4);
  }
}

}  // namespace
}  // namespace bnps::staleness
