#include "store/parameter_store.h"

#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace bnps::store {
namespace {

using Snapshot = ParameterStore::Snapshot;

ParameterStore::Options Sync(int workers, OptimizerOptions opt = {}) {
  return {workers, /*bulk_synchronous=*/true, opt};
}

// Pulls and returns the result if the callback ran at once.
std::optional<absl::StatusOr<Snapshot>> PullNow(ParameterStore& store,
                                               int64_t min_version,
                                               std::vector<std::string> keys = {}) {
  std::optional<absl::StatusOr<Snapshot>> out;
  store.Pull(std::move(keys), min_version, absl::InfiniteFuture(),
             [&](absl::StatusOr<Snapshot> s) { out = std::move(s); });
  return out;
}

TEST(ParameterStoreTest, InitFirstValueWins) {
  ParameterStore store(Sync(1));
  EXPECT_TRUE(*store.Init("w", {2}, {1, 2}));
  EXPECT_FALSE(*store.Init("w", {2}, {5, 6}));
  EXPECT_EQ(store.Init("v", {3}, {1, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto snap = PullNow(store, 0);
  ASSERT_TRUE(snap.has_value() && snap->ok());
  EXPECT_EQ(*(**snap)["w"].values, (std::vector<float>{1, 2}));
}

TEST(ParameterStoreTest, BulkSynchronousStepWaitsForEveryWorker) {
  ParameterStore store(Sync(2, {0.5, 0.0, 0.0}));
  ASSERT_TRUE(store.Init("w", {2}, {1, 1}).ok());
  std::optional<absl::StatusOr<Snapshot>> pulled;
  store.Pull({"w"}, 1, absl::InfiniteFuture(),
             [&](absl::StatusOr<Snapshot> s) { pulled = std::move(s); });
  ASSERT_TRUE(store.Push(0, 0, "w", {2}, {2, 4}, 2).ok());
  EXPECT_FALSE(pulled.has_value()) << "applied before worker 1 pushed";
  ASSERT_TRUE(store.Push(1, 0, "w", {2}, {4, 0}, 1).ok());
  ASSERT_TRUE(pulled.has_value());
  ASSERT_TRUE(pulled->ok());
  // gradient = (sum of sums) / (sum of samples) = ({6, 4}) / 3.
  const Snapshot& s = **pulled;
  EXPECT_EQ(s.at("w").version, 1);
  EXPECT_FLOAT_EQ((*s.at("w").values)[0], 1 - 0.5f * 2);
  EXPECT_FLOAT_EQ((*s.at("w").values)[1], 1 - 0.5f * 4.0f / 3);
}

// W workers with uneven batches follow single-process SGD (momentum, weight
// decay) on the concatenated batch, step after step.
TEST(ParameterStoreTest, MatchesSingleProcessSgd) {
  const OptimizerOptions opt{0.05, 0.9, 1e-3};
  const int workers = 3, size = 7, steps = 6;
  const std::vector<int64_t> batch = {4, 0, 9};  // per worker; one is empty
  ParameterStore store(Sync(workers, opt));
  std::vector<double> w(size), buf(size, 0.0);
  std::mt19937 rng(1);
  std::normal_distribution<double> normal;
  for (double& v : w) v = normal(rng);
  ASSERT_TRUE(store.Init("w", {size}, std::vector<float>(w.begin(), w.end())).ok());
  std::vector<float> w32(w.begin(), w.end());
  for (int step = 0; step < steps; ++step) {
    std::vector<double> total(size, 0.0);
    int64_t samples = 0;
    for (int k = 0; k < workers; ++k) {
      std::vector<float> g(size);
      for (float& v : g) v = batch[k] == 0 ? 0.0f : static_cast<float>(normal(rng));
      for (int i = 0; i < size; ++i) total[i] += g[i];
      samples += batch[k];
      ASSERT_TRUE(store.Push(k, step, "w", {size}, g, batch[k]).ok());
    }
    for (int i = 0; i < size; ++i) {  // one process, in float like the store
      const double d = total[i] / samples + opt.weight_decay * w32[i];
      buf[i] = static_cast<float>(opt.momentum * buf[i] + d);
      w32[i] = static_cast<float>(w32[i] - opt.learning_rate * buf[i]);
    }
    auto snap = PullNow(store, step + 1);
    ASSERT_TRUE(snap.has_value() && snap->ok());
    for (int i = 0; i < size; ++i) {
      EXPECT_NEAR((*(**snap)["w"].values)[i], w32[i], 1e-6) << step << " " << i;
    }
  }
}

// A parameter large enough to be stepped in blocks on every core (and by the
// widest vector kernel the CPU has) gets the same bits as the plain formula
// the store documents, evaluated one element at a time in push order.
TEST(ParameterStoreTest, LargeParameterStepHasTheBitsOfTheScalarFormula) {
  const OptimizerOptions opt{0.05, 0.9, 1e-3};
  const int workers = 3, size = 70001, steps = 3;
  const std::vector<int64_t> batch = {4, 1, 9};
  ParameterStore store(Sync(workers, opt));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  std::vector<float> w32(size), buf32(size, 0.0f);
  for (float& v : w32) v = normal(rng);
  ASSERT_TRUE(store.Init("w", {size}, w32).ok());
  for (int step = 0; step < steps; ++step) {
    std::vector<double> sum(size, 0.0);
    std::vector<float> last;
    for (int k = 0; k < workers; ++k) {
      std::vector<float> g(size);
      for (float& v : g) v = normal(rng);
      ASSERT_TRUE(store.Push(k, step, "w", {size}, g, batch[k]).ok());
      if (k + 1 < workers) {
        for (int i = 0; i < size; ++i) sum[i] += g[i];
      } else {
        last = std::move(g);
      }
    }
    const double scale = 1.0 / (batch[0] + batch[1] + batch[2]);
    for (int i = 0; i < size; ++i) {
      const double d = (sum[i] + last[i]) * scale + opt.weight_decay * w32[i];
      buf32[i] = static_cast<float>(opt.momentum * buf32[i] + d);
      w32[i] = static_cast<float>(w32[i] - opt.learning_rate * buf32[i]);
    }
    auto snap = PullNow(store, step + 1);
    ASSERT_TRUE(snap.has_value() && snap->ok());
    const std::vector<float>& got = *(**snap)["w"].values;
    int differing = 0;
    for (int i = 0; i < size; ++i) differing += got[i] != w32[i];
    EXPECT_EQ(differing, 0) << "step " << step;
  }
}

// A pulled snapshot is shared, not copied, and later steps leave it alone;
// pushes for the next step may arrive before the current one completes.
TEST(ParameterStoreTest, PulledValuesStayWhileStepsApply) {
  ParameterStore store(Sync(2, {1.0, 0.0, 0.0}));
  ASSERT_TRUE(store.Init("w", {2}, {0, 0}).ok());
  auto v0 = PullNow(store, 0);
  ASSERT_TRUE(v0.has_value() && v0->ok());
  ASSERT_TRUE(store.Push(0, 0, "w", {2}, {1, 2}, 1).ok());
  ASSERT_TRUE(store.Push(0, 1, "w", {2}, {4, 4}, 1).ok());  // ahead of step 0
  ASSERT_TRUE(store.Push(1, 0, "w", {2}, {3, 2}, 1).ok());
  auto v1 = PullNow(store, 1);
  ASSERT_TRUE(v1.has_value() && v1->ok());
  EXPECT_EQ(*(**v1)["w"].values, (std::vector<float>{-2, -2}));
  EXPECT_EQ((**v1)["w"].version, 1);
  ASSERT_TRUE(store.Push(1, 1, "w", {2}, {0, 2}, 1).ok());
  auto v2 = PullNow(store, 2);
  ASSERT_TRUE(v2.has_value() && v2->ok());
  EXPECT_EQ(*(**v2)["w"].values, (std::vector<float>{-4, -5}));
  // Earlier snapshots still hold their versions' values.
  EXPECT_EQ(*(**v0)["w"].values, (std::vector<float>{0, 0}));
  EXPECT_EQ(*(**v1)["w"].values, (std::vector<float>{-2, -2}));
  v0.reset();
  v1.reset();
  ASSERT_TRUE(store.Push(0, 2, "w", {2}, {2, 2}, 1).ok());
  ASSERT_TRUE(store.Push(1, 2, "w", {2}, {0, 0}, 1).ok());
  auto v3 = PullNow(store, 3);
  ASSERT_TRUE(v3.has_value() && v3->ok());
  EXPECT_EQ(*(**v3)["w"].values, (std::vector<float>{-5, -6}));
  EXPECT_EQ(*(**v2)["w"].values, (std::vector<float>{-4, -5}));
}

TEST(ParameterStoreTest, RetriedPushIsNotAppliedTwice) {
  ParameterStore store(Sync(1, {1.0, 0.0, 0.0}));
  ASSERT_TRUE(store.Init("w", {1}, {0}).ok());
  auto first = store.Push(0, 0, "w", {1}, {1}, 1);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->duplicate);
  auto again = store.Push(0, 0, "w", {1}, {1}, 1);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate);
  auto snap = PullNow(store, 0);
  EXPECT_EQ((**snap)["w"].version, 1);
  EXPECT_FLOAT_EQ((*(**snap)["w"].values)[0], -1.0f);
  EXPECT_EQ(store.GetStats().duplicates, 1);
  EXPECT_EQ(store.GetStats().applied, 1);
}

TEST(ParameterStoreTest, RejectsBadPushes) {
  ParameterStore store(Sync(2));
  ASSERT_TRUE(store.Init("w", {2}, {0, 0}).ok());
  EXPECT_EQ(store.Push(0, 0, "nope", {2}, {1, 1}, 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Push(0, 0, "w", {3}, {1, 1, 1}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Push(2, 0, "w", {2}, {1, 1}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Push(-1, 0, "w", {2}, {1, 1}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Push(0, -1, "w", {2}, {1, 1}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Push(0, 0, "w", {2}, {1, 1}, -3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Push(0, 5, "w", {2}, {1, 1}, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);  // from the future
}

TEST(ParameterStoreTest, StepFromThePastIsRefused) {
  ParameterStore store(Sync(2));
  ASSERT_TRUE(store.Init("w", {1}, {0}).ok());
  ASSERT_TRUE(store.Push(0, 0, "w", {1}, {1}, 1).ok());
  store.RemoveWorker(1);  // step 0 completes without worker 1
  EXPECT_EQ(store.Push(1, 0, "w", {1}, {1}, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ParameterStoreTest, PullTimesOutNamingMissingWorkers) {
  ParameterStore store(Sync(3));
  ASSERT_TRUE(store.Init("w", {1}, {0}).ok());
  ASSERT_TRUE(store.Push(1, 0, "w", {1}, {1}, 1).ok());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  std::optional<absl::StatusOr<Snapshot>> pulled;
  store.Pull({}, 1, t0 + absl::Seconds(5),
             [&](absl::StatusOr<Snapshot> s) { pulled = std::move(s); });
  store.ExpireDeadlines(t0 + absl::Seconds(4));
  EXPECT_FALSE(pulled.has_value());
  store.ExpireDeadlines(t0 + absl::Seconds(5));
  ASSERT_TRUE(pulled.has_value());
  EXPECT_EQ(pulled->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(pulled->status().message().find("workers [0, 2]"), std::string::npos)
      << pulled->status();
}

TEST(ParameterStoreTest, ShrinkCompletesTheStep) {
  ParameterStore store(Sync(2, {1.0, 0.0, 0.0}));
  ASSERT_TRUE(store.Init("w", {1}, {0}).ok());
  std::optional<absl::StatusOr<Snapshot>> pulled;
  store.Pull({}, 1, absl::InfiniteFuture(),
             [&](absl::StatusOr<Snapshot> s) { pulled = std::move(s); });
  ASSERT_TRUE(store.Push(0, 0, "w", {1}, {2}, 1).ok());
  EXPECT_FALSE(pulled.has_value());
  store.RemoveWorker(1);
  ASSERT_TRUE(pulled.has_value() && pulled->ok());
  EXPECT_FLOAT_EQ((*(**pulled)["w"].values)[0], -2.0f);
  EXPECT_EQ(store.Push(1, 1, "w", {1}, {2}, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);  // removed
}

TEST(ParameterStoreTest, FailedWorkerFailsWaitingPulls) {
  ParameterStore store(Sync(2));
  ASSERT_TRUE(store.Init("w", {1}, {0}).ok());
  std::optional<absl::StatusOr<Snapshot>> pulled;
  store.Pull({}, 1, absl::InfiniteFuture(),
             [&](absl::StatusOr<Snapshot> s) { pulled = std::move(s); });
  ASSERT_TRUE(store.Push(0, 0, "w", {1}, {2}, 1).ok());
  store.FailWorker(1, absl::UnavailableError("worker 1 lost"));
  ASSERT_TRUE(pulled.has_value());
  EXPECT_EQ(pulled->status().code(), absl::StatusCode::kUnavailable);
  // Later pulls that would wait fail at once too.
  auto later = PullNow(store, 1);
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->status().code(), absl::StatusCode::kUnavailable);
  // Pulls that need nothing from it still work.
  auto now = PullNow(store, 0);
  ASSERT_TRUE(now.has_value() && now->ok());
}

TEST(ParameterStoreTest, StaleSynchronousAppliesOnArrival) {
  ParameterStore store({2, /*bulk_synchronous=*/false, {1.0, 0.0, 0.0}});
  ASSERT_TRUE(store.Init("w", {1}, {0}).ok());
  ASSERT_TRUE(store.Push(0, 0, "w", {1}, {4}, 2).ok());  // mean gradient 2
  auto snap = PullNow(store, 0);
  EXPECT_EQ((**snap)["w"].version, 1);
  EXPECT_FLOAT_EQ((*(**snap)["w"].values)[0], -2.0f);
  ASSERT_TRUE(store.Push(0, 1, "w", {1}, {1}, 1).ok());  // ahead of worker 1
  ASSERT_TRUE(store.Push(1, 0, "w", {1}, {0}, 0).ok());  // no samples: no change
  snap = PullNow(store, 0);
  EXPECT_EQ((**snap)["w"].version, 3);
  EXPECT_FLOAT_EQ((*(**snap)["w"].values)[0], -3.0f);
  EXPECT_TRUE(store.Push(0, 1, "w", {1}, {1}, 1)->duplicate);
}

constexpr int64_t kFarFuture = 1'000'000'000'000'000;  // 10^15

void ExpectUnchanged(const ParameterStore& store, int64_t applied,
                     int64_t duplicates, int64_t version) {
  const ParameterStore::Stats s = store.GetStats();
  EXPECT_EQ(s.applied, applied);
  EXPECT_EQ(s.duplicates, duplicates);
  EXPECT_EQ(s.min_version, version);
}

// A step no clock allows is refused and changes nothing: the worker's real
// pushes afterwards are applied, not taken for duplicates.
TEST(ParameterStoreTest, StaleSynchronousRefusesStepsBeyondTheBound) {
  ParameterStore::Options o{2, /*bulk_synchronous=*/false, {1.0, 0.0, 0.0}};
  o.staleness = 1;
  ParameterStore store(o);
  ASSERT_TRUE(store.Init("w", {1}, {0}).ok());
  for (int64_t step : {kFarFuture, int64_t{2}}) {  // nothing pushed yet: <= 1
    absl::StatusOr<ParameterStore::PushResult> r =
        store.Push(0, step, "w", {1}, {1}, 1);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << step;
    EXPECT_NE(r.status().message().find("future"), std::string::npos);
    EXPECT_EQ(store.CheckPush(0, step, "w", {1}).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  ExpectUnchanged(store, 0, 0, 0);
  absl::StatusOr<ParameterStore::PushResult> r =
      store.Push(0, 0, "w", {1}, {1}, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->duplicate);
  ASSERT_TRUE(store.Push(0, 1, "w", {1}, {1}, 1).ok());
  // Newest step 1: worker 1 may be at most one step beyond step 2.
  EXPECT_EQ(store.Push(1, 4, "w", {1}, {1}, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  r = store.Push(1, 3, "w", {1}, {1}, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->duplicate);
  r = store.Push(1, 0, "w", {1}, {1}, 1);  // worker 1 is at step 3 already
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->duplicate);
  ExpectUnchanged(store, 3, 1, 3);
}

TEST(ParameterStoreTest, BulkSynchronousRefusesStepsBeyondTheNextVersion) {
  ParameterStore store(Sync(1));
  ASSERT_TRUE(store.Init("w", {1}, {0}).ok());
  for (int64_t step : {kFarFuture, int64_t{2}}) {
    EXPECT_EQ(store.Push(0, step, "w", {1}, {1}, 1).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  ExpectUnchanged(store, 0, 0, 0);
  absl::StatusOr<ParameterStore::PushResult> r =
      store.Push(0, 0, "w", {1}, {1}, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->duplicate);
  ExpectUnchanged(store, 1, 0, 1);
}

// CheckPush says what Push would, before anything is read or reserved.
TEST(ParameterStoreTest, CheckPushGivesPushsVerdict) {
  ParameterStore store(Sync(2));
  ASSERT_TRUE(store.Init("w", {2, 3}, std::vector<float>(6, 0)).ok());
  EXPECT_TRUE(store.CheckPush(0, 0, "w", {2, 3}).ok());
  EXPECT_EQ(store.CheckPush(0, 0, "nope", {int64_t{1} << 30}).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store.CheckPush(0, 0, "w", {int64_t{1} << 30}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.CheckPush(0, 0, "w", {3, 2}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.CheckPush(2, 0, "w", {2, 3}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.CheckPush(0, -1, "w", {2, 3}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.CheckPush(0, 5, "w", {2, 3}).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store.Push(0, 0, "w", {2, 3}, std::vector<float>(6, 1), 1).ok());
  EXPECT_TRUE(store.CheckPush(0, 0, "w", {2, 3}).ok());  // a duplicate
  store.RemoveWorker(1);
  EXPECT_EQ(store.CheckPush(1, 0, "w", {2, 3}).code(),
            absl::StatusCode::kFailedPrecondition);
  ExpectUnchanged(store, 1, 0, 1);
}

TEST(ParameterStoreTest, UnknownKeyInPull) {
  ParameterStore store(Sync(1));
  auto snap = PullNow(store, 0, {"nope"});
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->status().code(), absl::StatusCode::kNotFound);
}


// What an in-order pull handed out so far: the keys in order, and how it
// ended (nullopt while it goes on).
struct InOrderLog {
  std::vector<std::string> keys;
  std::vector<int64_t> versions;
  int parts = 0;
  std::optional<absl::Status> end;
};

void PullInOrder(ParameterStore& store, std::vector<std::string> keys,
                 int64_t min_version, absl::Time deadline, InOrderLog* log) {
  store.PullInOrder(
      std::move(keys), min_version, deadline,
      [log](absl::StatusOr<ParameterStore::PullPart> part) {
        ASSERT_FALSE(log->end.has_value()) << "a call after the last";
        if (!part.ok()) {
          log->end = part.status();
          return;
        }
        ++log->parts;
        for (const auto& [key, t] : part->tensors) {
          log->keys.push_back(key);
          log->versions.push_back(t.version);
        }
        if (part->last) log->end = absl::OkStatus();
      });
}

// Three keys of one worker, pulled in an order that is not key order.
TEST(ParameterStoreTest, InOrderPullSendsEachKeyWhenReady) {
  ParameterStore store(Sync(1, {1.0, 0.0, 0.0}));
  for (const char* k : {"a", "b", "c"}) ASSERT_TRUE(store.Init(k, {1}, {0}).ok());
  InOrderLog log;
  PullInOrder(store, {"c", "a", "b"}, 1, absl::InfiniteFuture(), &log);
  EXPECT_TRUE(log.keys.empty());
  // "a" is ready first, but "c" comes before it.
  ASSERT_TRUE(store.Push(0, 0, "a", {1}, {1}, 1).ok());
  EXPECT_TRUE(log.keys.empty());
  ASSERT_TRUE(store.Push(0, 0, "c", {1}, {2}, 1).ok());
  EXPECT_EQ(log.keys, (std::vector<std::string>{"c", "a"}));
  EXPECT_EQ(log.parts, 1);  // both in one run
  EXPECT_FALSE(log.end.has_value());
  ASSERT_TRUE(store.Push(0, 0, "b", {1}, {3}, 1).ok());
  EXPECT_EQ(log.keys, (std::vector<std::string>{"c", "a", "b"}));
  EXPECT_EQ(log.versions, (std::vector<int64_t>{1, 1, 1}));
  ASSERT_TRUE(log.end.has_value());
  EXPECT_TRUE(log.end->ok()) << *log.end;
}

TEST(ParameterStoreTest, InOrderPullOfReadyKeysIsOneCall) {
  ParameterStore store(Sync(1));
  for (const char* k : {"a", "b"}) ASSERT_TRUE(store.Init(k, {1}, {0}).ok());
  InOrderLog log;
  PullInOrder(store, {}, 0, absl::InfiniteFuture(), &log);  // every key
  EXPECT_EQ(log.keys, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(log.parts, 1);
  ASSERT_TRUE(log.end.has_value() && log.end->ok());

  ParameterStore empty(Sync(1));
  InOrderLog none;
  PullInOrder(empty, {}, 3, absl::InfiniteFuture(), &none);
  EXPECT_EQ(none.parts, 1);
  ASSERT_TRUE(none.end.has_value() && none.end->ok());
}

TEST(ParameterStoreTest, InOrderPullRefusesUnknownAndRepeatedKeys) {
  ParameterStore store(Sync(1));
  ASSERT_TRUE(store.Init("a", {1}, {0}).ok());
  InOrderLog unknown;
  PullInOrder(store, {"a", "nope"}, 0, absl::InfiniteFuture(), &unknown);
  EXPECT_TRUE(unknown.keys.empty()) << "nothing before the refusal";
  ASSERT_TRUE(unknown.end.has_value());
  EXPECT_EQ(unknown.end->code(), absl::StatusCode::kNotFound);
  InOrderLog twice;
  PullInOrder(store, {"a", "a"}, 0, absl::InfiniteFuture(), &twice);
  ASSERT_TRUE(twice.end.has_value());
  EXPECT_EQ(twice.end->code(), absl::StatusCode::kInvalidArgument);
}

// The keys before the one that times out were sent; the error names the
// workers that key waits for.
TEST(ParameterStoreTest, InOrderPullTimesOutAfterTheReadyKeys) {
  ParameterStore store(Sync(2));
  for (const char* k : {"a", "b"}) ASSERT_TRUE(store.Init(k, {1}, {0}).ok());
  for (int w : {0, 1}) ASSERT_TRUE(store.Push(w, 0, "a", {1}, {1}, 1).ok());
  ASSERT_TRUE(store.Push(1, 0, "b", {1}, {1}, 1).ok());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  InOrderLog log;
  PullInOrder(store, {"a", "b"}, 1, t0 + absl::Seconds(5), &log);
  EXPECT_EQ(log.keys, (std::vector<std::string>{"a"}));
  store.ExpireDeadlines(t0 + absl::Seconds(4));
  EXPECT_FALSE(log.end.has_value());
  store.ExpireDeadlines(t0 + absl::Seconds(5));
  ASSERT_TRUE(log.end.has_value());
  EXPECT_EQ(log.end->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(log.end->message().find("'b' still waits for workers [0]"),
            std::string::npos)
      << *log.end;
  EXPECT_EQ(log.keys, (std::vector<std::string>{"a"}));
}

TEST(ParameterStoreTest, InOrderPullFailsForALostWorker) {
  ParameterStore store(Sync(2));
  for (const char* k : {"a", "b"}) ASSERT_TRUE(store.Init(k, {1}, {0}).ok());
  for (int w : {0, 1}) ASSERT_TRUE(store.Push(w, 0, "a", {1}, {1}, 1).ok());
  ASSERT_TRUE(store.Push(0, 0, "b", {1}, {1}, 1).ok());
  InOrderLog log;
  PullInOrder(store, {"a", "b"}, 1, absl::InfiniteFuture(), &log);
  store.FailWorker(1, absl::FailedPreconditionError("worker 1 lost"));
  ASSERT_TRUE(log.end.has_value());
  EXPECT_EQ(log.end->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(log.keys, (std::vector<std::string>{"a"}));
  // A later in-order pull that would wait for it fails after "a" too.
  InOrderLog later;
  PullInOrder(store, {"a", "b"}, 1, absl::InfiniteFuture(), &later);
  EXPECT_EQ(later.keys, (std::vector<std::string>{"a"}));
  ASSERT_TRUE(later.end.has_value());
  EXPECT_EQ(later.end->code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ParameterStoreTest, InOrderPullEndsWithTheImportStatus) {
  ParameterStore store(Sync(1));
  for (const char* k : {"a", "b"}) ASSERT_TRUE(store.Init(k, {1}, {0}).ok());
  const StoreState before = store.Export();
  ASSERT_TRUE(store.Push(0, 0, "a", {1}, {1}, 1).ok());
  InOrderLog log;
  PullInOrder(store, {"a", "b"}, 1, absl::InfiniteFuture(), &log);
  EXPECT_EQ(log.keys, (std::vector<std::string>{"a"}));
  ASSERT_TRUE(store.Import(before, absl::AbortedError("rolls back")).ok());
  ASSERT_TRUE(log.end.has_value());
  EXPECT_EQ(log.end->code(), absl::StatusCode::kAborted);
  // Nothing more once it ended.
  ASSERT_TRUE(store.Push(0, 0, "b", {1}, {1}, 1).ok());
  EXPECT_EQ(log.keys, (std::vector<std::string>{"a"}));
}

// Pushes from several threads make keys ready in any order; the pull still
// hands them out in its order, one call at a time.
TEST(ParameterStoreTest, InOrderPullKeepsItsOrderUnderConcurrentPushes) {
  constexpr int kKeys = 16;
  ParameterStore store(Sync(1));
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back(absl::StrCat("k", i));
    ASSERT_TRUE(store.Init(keys.back(), {1}, {0}).ok());
  }
  std::vector<std::string> order(keys.rbegin(), keys.rend());
  absl::Mutex mu;
  std::vector<std::string> got;
  int inside = 0;
  bool overlapped = false;
  absl::Notification done;
  store.PullInOrder(order, 1, absl::InfiniteFuture(),
                    [&](absl::StatusOr<ParameterStore::PullPart> part) {
                      {
                        absl::MutexLock lock(&mu);
                        overlapped |= inside++ > 0;
                        ASSERT_TRUE(part.ok()) << part.status();
                        for (const auto& [k, t] : part->tensors) got.push_back(k);
                      }
                      absl::SleepFor(absl::Microseconds(50));
                      absl::MutexLock lock(&mu);
                      --inside;
                      if (part->last) done.Notify();
                    });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kKeys; i += 4) {
        EXPECT_TRUE(store.Push(0, 0, keys[i], {1}, {1}, 1).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(got, order);
  EXPECT_FALSE(overlapped);
}

}  // namespace
}  // namespace bnps::store
