#include "worker/host_bn_group.h"

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bn/moments.h"
#include "gtest/gtest.h"

namespace bnps::worker {
namespace {

// Upstream that records what reaches it and answers with what it got (as
// one worker alone would), or with a fixed error.
class RecordingExchange : public nn::BnExchange {
 public:
  absl::StatusOr<bn::Moments> Forward(const std::string& layer,
                                      const bn::Moments& local) override {
    absl::MutexLock lock(&mu_);
    calls.push_back("F " + layer);
    forwards.push_back(local);
    if (!fail.ok()) return fail;
    return local;
  }
  absl::StatusOr<bn::BackwardSums> Backward(
      const std::string& layer, const bn::BackwardSums& local) override {
    absl::MutexLock lock(&mu_);
    calls.push_back("B " + layer);
    backwards.push_back(local);
    if (!fail.ok()) return fail;
    return local;
  }

  absl::Mutex mu_;
  std::vector<std::string> calls;
  std::vector<bn::Moments> forwards;
  std::vector<bn::BackwardSums> backwards;
  absl::Status fail;
};

bn::Moments RandomMoments(std::mt19937_64& rng, int64_t count, int channels) {
  std::normal_distribution<double> normal(3.0, 2.0);
  bn::Moments m;
  m.count = count;
  for (int c = 0; c < channels; ++c) {
    m.mean.push_back(count > 0 ? normal(rng) : 0.0);
    m.m2.push_back(count > 0 ? std::abs(normal(rng)) * count : 0.0);
  }
  return m;
}

bn::BackwardSums RandomSums(std::mt19937_64& rng, int channels) {
  std::normal_distribution<double> normal(0.0, 1.0);
  bn::BackwardSums s = bn::BackwardSums::Zero(channels);
  for (int c = 0; c < channels; ++c) {
    s.sum_dy[c] = normal(rng) * 1e3;
    s.sum_dy_xhat[c] = normal(rng) * 1e-3;
  }
  return s;
}

// Runs `layers` forward then backward in reverse on `k` replica threads;
// replica r sleeps delays[r] before each call so arrival orders vary.
struct RunResult {
  std::vector<std::vector<bn::Moments>> forward;        // [replica][layer]
  std::vector<std::vector<bn::BackwardSums>> backward;  // [replica][layer]
  std::vector<absl::Status> status;
};

RunResult RunReplicas(HostBnGroup& group, int layers,
              const std::vector<std::vector<bn::Moments>>& moments,
              const std::vector<std::vector<bn::BackwardSums>>& sums,
              const std::vector<absl::Duration>& delays) {
  const int k = group.replicas();
  RunResult out;
  out.forward.resize(k);
  out.backward.resize(k);
  out.status.assign(k, absl::OkStatus());
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      nn::BnExchange* ex = group.member(r);
      for (int l = 0; l < layers; ++l) {
        absl::SleepFor(delays[r]);
        absl::StatusOr<bn::Moments> m =
            ex->Forward(absl::StrCat("bn", l), moments[r][l]);
        if (!m.ok()) { out.status[r] = m.status(); return; }
        out.forward[r].push_back(*m);
      }
      for (int l = layers - 1; l >= 0; --l) {
        absl::SleepFor(delays[r]);
        absl::StatusOr<bn::BackwardSums> s =
            ex->Backward(absl::StrCat("bn", l), sums[r][l]);
        if (!s.ok()) { out.status[r] = s.status(); return; }
        out.backward[r].push_back(*s);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(HostBnGroupTest, CrossesOnceWithTheReplicaOrderMergeWhateverTheArrival) {
  constexpr int kReplicas = 3, kLayers = 5, kChannels = 7;
  std::mt19937_64 rng(42);
  std::vector<std::vector<bn::Moments>> moments(kReplicas);
  std::vector<std::vector<bn::BackwardSums>> sums(kReplicas);
  for (int r = 0; r < kReplicas; ++r) {
    for (int l = 0; l < kLayers; ++l) {
      // Uneven counts, one replica empty at layer 2.
      moments[r].push_back(
          RandomMoments(rng, (r == 1 && l == 2) ? 0 : 16 * (r + 1), kChannels));
      sums[r].push_back(RandomSums(rng, kChannels));
    }
  }
  const std::vector<std::vector<absl::Duration>> schedules = {
      {absl::ZeroDuration(), absl::ZeroDuration(), absl::ZeroDuration()},
      {absl::Milliseconds(3), absl::ZeroDuration(), absl::Milliseconds(1)},
      {absl::ZeroDuration(), absl::Milliseconds(2), absl::Milliseconds(4)},
  };
  std::vector<RunResult> results;
  for (const auto& delays : schedules) {
    RecordingExchange up;
    HostBnGroup group(kReplicas, &up);
    results.push_back(RunReplicas(group, kLayers, moments, sums, delays));
    for (const absl::Status& s : results.back().status) ASSERT_TRUE(s.ok()) << s;
    // One upstream call per layer and phase, in model order.
    ASSERT_EQ(up.calls.size(), 2u * kLayers);
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_EQ(up.calls[l], absl::StrCat("F bn", l));
      EXPECT_EQ(up.calls[kLayers + l], absl::StrCat("B bn", kLayers - 1 - l));
      // What crossed is the replica-order merge, bit for bit.
      std::vector<bn::Moments> parts;
      for (int r = 0; r < kReplicas; ++r) parts.push_back(moments[r][l]);
      absl::StatusOr<bn::Moments> want = bn::MergeMoments(parts);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(up.forwards[l].count, want->count);
      EXPECT_EQ(up.forwards[l].mean, want->mean);
      EXPECT_EQ(up.forwards[l].m2, want->m2);
      bn::BackwardSums want_sums = bn::BackwardSums::Zero(kChannels);
      for (int r = 0; r < kReplicas; ++r) {
        ASSERT_TRUE(bn::AddSums(sums[r][kLayers - 1 - l], &want_sums).ok());
      }
      EXPECT_EQ(up.backwards[l].sum_dy, want_sums.sum_dy);
      EXPECT_EQ(up.backwards[l].sum_dy_xhat, want_sums.sum_dy_xhat);
    }
    // Every replica got upstream's answer.
    for (int r = 0; r < kReplicas; ++r) {
      for (int l = 0; l < kLayers; ++l) {
        EXPECT_EQ(results.back().forward[r][l].mean, up.forwards[l].mean);
        EXPECT_EQ(results.back().backward[r][l].sum_dy, up.backwards[l].sum_dy);
      }
    }
  }
  // Bitwise the same under every schedule.
  for (size_t i = 1; i < results.size(); ++i) {
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_EQ(results[i].forward[0][l].m2, results[0].forward[0][l].m2);
      EXPECT_EQ(results[i].backward[0][l].sum_dy_xhat,
                results[0].backward[0][l].sum_dy_xhat);
    }
  }
}

TEST(HostBnGroupTest, OneReplicaIsAPassThrough) {
  RecordingExchange up;
  HostBnGroup group(1, &up);
  std::mt19937_64 rng(7);
  bn::Moments m = RandomMoments(rng, 10, 3);
  absl::StatusOr<bn::Moments> got = group.member(0)->Forward("bn0", m);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->mean, m.mean);
  EXPECT_EQ(got->m2, m.m2);
  EXPECT_EQ(up.calls.size(), 1u);
}

TEST(HostBnGroupTest, UpstreamErrorReachesEveryReplica) {
  RecordingExchange up;
  up.fail = absl::DeadlineExceededError("worker 3 did not reach the barrier");
  HostBnGroup group(2, &up);
  std::mt19937_64 rng(1);
  std::vector<std::vector<bn::Moments>> moments = {
      {RandomMoments(rng, 4, 2)}, {RandomMoments(rng, 4, 2)}};
  std::vector<std::vector<bn::BackwardSums>> sums = {{RandomSums(rng, 2)},
                                                     {RandomSums(rng, 2)}};
  RunResult r = RunReplicas(group, 1, moments, sums,
                    {absl::ZeroDuration(), absl::Milliseconds(2)});
  for (const absl::Status& s : r.status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("worker 3"), std::string::npos);
  }
  EXPECT_EQ(up.calls.size(), 1u);  // one crossing, not one per replica
}

TEST(HostBnGroupTest, AbortWakesAWaitingReplicaAndEndsLaterRounds) {
  RecordingExchange up;
  HostBnGroup group(2, &up);
  std::mt19937_64 rng(3);
  const bn::Moments m = RandomMoments(rng, 4, 2);
  absl::Status waited;
  std::thread t([&] { waited = group.member(0)->Forward("bn0", m).status(); });
  absl::SleepFor(absl::Milliseconds(20));  // replica 1 never comes
  group.Abort(absl::InternalError("replica 1 failed: out of memory"));
  t.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled);
  EXPECT_NE(waited.message().find("out of memory"), std::string::npos);
  EXPECT_EQ(group.member(1)->Forward("bn0", m).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_TRUE(up.calls.empty());

  // A new step after a recovery: the group works again, from a clean round.
  group.Reset();
  absl::StatusOr<bn::Moments> again;
  std::thread t2([&] { again = group.member(0)->Forward("bn0", m); });
  absl::StatusOr<bn::Moments> other = group.member(1)->Forward("bn0", m);
  t2.join();
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(again->count, 2 * m.count);
  EXPECT_EQ(up.calls.size(), 1u);
}

TEST(HostBnGroupTest, ReplicasOnDifferentLayersFailClearly) {
  RecordingExchange up;
  HostBnGroup group(2, &up);
  std::mt19937_64 rng(5);
  const bn::Moments m = RandomMoments(rng, 4, 2);
  absl::Status first;
  std::thread t([&] { first = group.member(0)->Forward("stem.bn", m).status(); });
  absl::SleepFor(absl::Milliseconds(10));
  absl::Status second = group.member(1)->Forward("head.bn", m).status();
  t.join();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.message().find("head.bn"), std::string::npos);
  EXPECT_NE(second.message().find("stem.bn"), std::string::npos);
  EXPECT_EQ(first.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(HostBnGroupTest, MismatchedChannelsAreInvalidArgument) {
  RecordingExchange up;
  HostBnGroup group(2, &up);
  std::mt19937_64 rng(9);
  absl::Status a, b;
  std::thread t([&] {
    a = group.member(0)->Forward("bn0", RandomMoments(rng, 4, 2)).status();
  });
  absl::SleepFor(absl::Milliseconds(5));
  std::mt19937_64 rng2(10);
  b = group.member(1)->Forward("bn0", RandomMoments(rng2, 4, 3)).status();
  t.join();
  EXPECT_EQ(a.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(up.calls.empty());
}

}  // namespace
}  // namespace bnps::worker
