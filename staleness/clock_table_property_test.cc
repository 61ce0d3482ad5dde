// Random interleavings of workers under a ClockTable, checked against a plain
// model of the SSP rule after every event: the bound is never broken, refusals
// are justified, and the slowest live worker can always go on (no deadlock).

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "staleness/clock_table.h"

namespace bnps::staleness {
namespace {

// What the scheduler knows, kept apart from the table under test.
struct Model {
  int64_t s = 0;
  std::vector<int64_t> clock;
  std::vector<bool> live;
  std::vector<bool> mid_step;  // running step clock[w]

  int64_t MinLive() const {
    int64_t min = ClockTable::kNoLiveWorkers;
    for (size_t w = 0; w < clock.size(); ++w) {
      if (live[w]) min = std::min(min, clock[w]);
    }
    return min;
  }
  int NumLive() const {
    return static_cast<int>(std::count(live.begin(), live.end(), true));
  }
  std::vector<int> Laggards(int64_t step) const {
    std::vector<int> out;
    for (size_t w = 0; w < clock.size(); ++w) {
      if (live[w] && clock[w] < step - s) out.push_back(static_cast<int>(w));
    }
    return out;
  }
};

// The table agrees with the model, and the SSP invariants hold.
void CheckInvariants(const ClockTable& t, const Model& m) {
  const int workers = static_cast<int>(m.clock.size());
  const int64_t min = m.MinLive();
  ASSERT_EQ(t.num_live(), m.NumLive());
  ASSERT_EQ(t.MinLiveClock(), min);
  int slowest = -1;
  for (int w = 0; w < workers; ++w) {
    ASSERT_EQ(t.clock(w), m.clock[w]) << "worker " << w;
    ASSERT_EQ(t.IsLive(w), m.live[w]) << "worker " << w;
    if (!m.live[w]) continue;
    // A running step c began when the minimum was >= c - s; the minimum never
    // decreases. A completed step c - 1 likewise gives clock <= min + s + 1.
    if (m.mid_step[w]) {
      ASSERT_LE(m.clock[w], min + m.s) << "worker " << w;
    }
    ASSERT_LE(m.clock[w], min + m.s + 1) << "worker " << w;
    ASSERT_EQ(t.Laggards(m.clock[w]), m.Laggards(m.clock[w]));
    if (slowest < 0 || m.clock[w] < m.clock[slowest]) slowest = w;
  }
  // Liveness: the slowest live worker is running a step or may begin its next.
  if (slowest >= 0 && !m.mid_step[slowest]) {
    ASSERT_TRUE(t.MayStart(slowest, m.clock[slowest])) << "deadlock";
  }
}

void Simulate(int workers, int64_t s, uint32_t seed, int events) {
  SCOPED_TRACE(testing::Message() << "W=" << workers << " s=" << s
                                  << " seed=" << seed);
  std::mt19937 rng(seed);
  auto chance = [&rng](int percent) {
    return std::uniform_int_distribution<int>(0, 99)(rng) < percent;
  };
  absl::StatusOr<ClockTable> created = ClockTable::Create(workers, s);
  ASSERT_TRUE(created.ok());
  ClockTable t = *created;
  Model m{s, std::vector<int64_t>(workers, 0), std::vector<bool>(workers, true),
          std::vector<bool>(workers, false)};

  for (int e = 0; e < events; ++e) {
    const int w = std::uniform_int_distribution<int>(0, workers - 1)(rng);
    const int64_t c = m.clock[w];
    if (!m.live[w]) {
      // A dead worker can neither start nor report progress.
      ASSERT_FALSE(t.MayStart(w, c));
      ASSERT_EQ(t.Advance(w, c + 1).code(), absl::StatusCode::kFailedPrecondition);
      ASSERT_TRUE(t.Remove(w).ok());
    } else if (chance(2) && m.NumLive() > 1) {
      ASSERT_TRUE(t.Remove(w).ok());
      m.live[w] = false;
      m.mid_step[w] = false;
    } else if (m.mid_step[w]) {
      if (chance(10)) {
        ASSERT_TRUE(t.Advance(w, c).ok());  // a retried report
      }
      if (c > 0 && chance(10)) {
        ASSERT_EQ(t.Advance(w, c - 1).code(),
                  absl::StatusCode::kFailedPrecondition);
      }
      ASSERT_TRUE(t.Advance(w, c + 1).ok()) << "finishing step " << c;
      m.clock[w] = c + 1;
      m.mid_step[w] = false;
    } else if (chance(5)) {
      // Report two steps at once, as if it had skipped asking to start c + 1:
      // legal iff the minimum allowed beginning step c + 1.
      const bool legal = m.MinLive() >= c + 1 - s;
      const absl::Status status = t.Advance(w, c + 2);
      ASSERT_EQ(status.ok(), legal) << status;
      if (legal) m.clock[w] = c + 2;
    } else {
      const bool legal = m.MinLive() >= c - s;
      ASSERT_EQ(t.MayStart(w, c), legal) << "worker " << w << " step " << c;
      if (legal) {
        m.mid_step[w] = true;
      } else {
        // Refused: someone really lags, and finishing the step anyway is caught.
        ASSERT_FALSE(t.Laggards(c).empty());
        ASSERT_EQ(t.Advance(w, c + 1).code(),
                  absl::StatusCode::kFailedPrecondition);
      }
    }
    ASSERT_NO_FATAL_FAILURE(CheckInvariants(t, m)) << "after event " << e;
  }

  // Progress: always running the slowest live worker raises the minimum by one
  // at least every `workers` steps.
  const int64_t before = m.MinLive();
  constexpr int kRounds = 5;
  for (int i = 0; i < workers * kRounds; ++i) {
    int slowest = -1;
    for (int w = 0; w < workers; ++w) {
      if (m.live[w] && (slowest < 0 || m.clock[w] < m.clock[slowest])) slowest = w;
    }
    ASSERT_GE(slowest, 0);
    if (!m.mid_step[slowest]) {
      ASSERT_TRUE(t.MayStart(slowest, m.clock[slowest])) << "deadlock";
    }
    ASSERT_TRUE(t.Advance(slowest, m.clock[slowest] + 1).ok());
    ++m.clock[slowest];
    m.mid_step[slowest] = false;
    ASSERT_NO_FATAL_FAILURE(CheckInvariants(t, m));
  }
  ASSERT_GE(m.MinLive(), before + kRounds);
}

TEST(ClockTablePropertyTest, RandomInterleavingsKeepTheBound) {
  for (int workers : {1, 2, 3, 5, 8}) {
    for (int64_t s : {0, 1, 2, 4}) {
      for (uint32_t seed = 0; seed < 200; ++seed) {
        Simulate(workers, s, seed, /*events=*/300);
        if (HasFatalFailure()) return;
      }
    }
  }
}

}  // namespace
}  // namespace bnps::staleness
