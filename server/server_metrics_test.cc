#include "server/server_metrics.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/registry.h"
#include "server/shard.h"

namespace bnps::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class ServerMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardOptions o;
    o.num_workers = 3;
    o.start_ticker = false;
    o.now = [this] { return now_; };
    absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(o);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = *std::move(shard);
    metrics_ = std::make_unique<ServerMetrics>(&registry_, shard_.get());
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  metrics::Registry registry_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ServerMetrics> metrics_;
};

TEST_F(ServerMetricsTest, RequestsByMethodAndCode) {
  metrics_->Request(ServerMetrics::kRegister, absl::StatusCode::kOk);
  metrics_->Request(ServerMetrics::kRegister, absl::StatusCode::kOk);
  metrics_->Request(ServerMetrics::kBnSync, absl::StatusCode::kDeadlineExceeded);
  const std::string text = registry_.TextExposition();
  EXPECT_THAT(text, HasSubstr("bnps_server_requests_total{method=\"Register\","
                              "code=\"OK\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("bnps_server_requests_total{method=\"BnSync\","
                              "code=\"DEADLINE_EXCEEDED\"} 1\n"));
  // Codes that never happened have no series.
  EXPECT_THAT(text, Not(HasSubstr("code=\"INTERNAL\"")));
}

TEST_F(ServerMetricsTest, PushesAndWorkerSteps) {
  metrics_->PushApplied(1);
  metrics_->PushApplied(1);
  metrics_->PushDuplicate();
  metrics_->PushRejected(absl::StatusCode::kFailedPrecondition);
  metrics_->WorkerAt(1, 7);
  metrics_->WorkerAt(1, 5);  // older: the newest stays
  metrics_->WorkerAt(9, 5);  // outside the job: ignored
  EXPECT_EQ(metrics_->worker_pushes(1), 2);
  EXPECT_EQ(metrics_->worker_pushes(0), 0);
  EXPECT_EQ(metrics_->worker_step(1), 7);
  EXPECT_EQ(metrics_->worker_step(0), -1);
  const std::string text = registry_.TextExposition();
  EXPECT_THAT(text, HasSubstr("bnps_server_pushes_total{result=\"applied\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("bnps_server_pushes_total{result=\"duplicate\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("bnps_server_push_rejections_total{reason="
                              "\"FAILED_PRECONDITION\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("bnps_server_worker_step{worker=\"1\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("bnps_server_worker_step{worker=\"0\"} -1\n"));
}

TEST_F(ServerMetricsTest, WorkersByState) {
  ASSERT_TRUE(shard_->Register(0, 11).ok());
  ASSERT_TRUE(shard_->Register(2, 12).ok());
  now_ += absl::Seconds(11);  // past the 10 s heartbeat timeout
  ASSERT_TRUE(shard_->membership().Heartbeat(2, 12, now_).ok());
  shard_->Tick(now_);
  const std::string text = registry_.TextExposition();
  EXPECT_THAT(text, HasSubstr("bnps_server_workers{state=\"live\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("bnps_server_workers{state=\"lost\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("bnps_server_workers{state=\"unregistered\"} 1\n"));
}

TEST_F(ServerMetricsTest, LayerWaitsAndTheSlowestOfTheNewestStep) {
  ServerMetrics::Layer* bn1 = metrics_->ForLayer("conv1/bn");
  EXPECT_EQ(bn1, metrics_->ForLayer("conv1/bn"));
  bn1->Observe(ServerMetrics::kForward, 0, absl::Milliseconds(30),
               absl::Microseconds(5));
  bn1->Observe(ServerMetrics::kForward, 1, absl::Milliseconds(2),
               absl::ZeroDuration());
  bn1->Observe(ServerMetrics::kForward, 1, absl::Milliseconds(4),
               absl::Microseconds(5));
  const std::vector<ServerMetrics::LayerSummary> layers = metrics_->Layers();
  ASSERT_EQ(layers.size(), 1u);
  EXPECT_EQ(layers[0].layer, "conv1/bn");
  EXPECT_EQ(layers[0].phase, ServerMetrics::kForward);
  EXPECT_EQ(layers[0].messages, 3);
  EXPECT_NEAR(layers[0].mean_wait_seconds, 0.012, 1e-9);
  EXPECT_EQ(layers[0].step, 1);
  EXPECT_NEAR(layers[0].slowest_wait_seconds, 0.004, 1e-9);
  const std::string text = registry_.TextExposition();
  EXPECT_THAT(text, HasSubstr("bnps_server_bn_barrier_wait_seconds_count{"
                              "layer=\"conv1/bn\",phase=\"forward\"} 3\n"));
  // The merge is timed where one was computed.
  EXPECT_THAT(text, HasSubstr("bnps_server_bn_merge_seconds_count{"
                              "layer=\"conv1/bn\",phase=\"forward\"} 2\n"));
  EXPECT_THAT(text, Not(HasSubstr("phase=\"backward\"")));
}

// With BN groups, each barrier message's wait goes to the group whose
// merge answered it (BnAggregator::Reply::group), by phase.
TEST(ServerMetricsGroupsTest, BarrierWaitsByGroup) {
  for (const bool by_host : {false, true}) {
    ShardOptions o;
    o.num_workers = 4;
    o.bn_group_size = by_host ? 0 : 2;
    o.bn_group_by_host = by_host;
    o.start_ticker = false;
    absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(o);
    ASSERT_TRUE(shard.ok()) << shard.status();
    metrics::Registry registry;
    ServerMetrics m(&registry, shard->get());
    m.GroupWait(0, ServerMetrics::kForward, absl::Milliseconds(250));
    m.GroupWait(0, ServerMetrics::kForward, absl::Milliseconds(500));
    m.GroupWait(1, ServerMetrics::kForward, absl::Seconds(2));
    m.GroupWait(1, ServerMetrics::kBackward, absl::Milliseconds(125));
    m.GroupWait(0, ServerMetrics::kRecal, absl::Seconds(9));  // no barrier's
    m.GroupWait(-1, ServerMetrics::kForward, absl::Seconds(9));  // no group
    m.GroupWait(4, ServerMetrics::kForward, absl::Seconds(9));  // outside
    const std::string text = registry.TextExposition();
    const std::string name = "bnps_server_bn_group_barrier_wait_seconds";
    EXPECT_THAT(text, HasSubstr(name + "_count{group=\"0\",phase=\"forward\"} 2\n"));
    EXPECT_THAT(text, HasSubstr(name + "_sum{group=\"0\",phase=\"forward\"} 0.75\n"));
    EXPECT_THAT(text, HasSubstr(name + "_count{group=\"1\",phase=\"forward\"} 1\n"));
    EXPECT_THAT(text, HasSubstr(name + "_sum{group=\"1\",phase=\"forward\"} 2\n"));
    EXPECT_THAT(text, HasSubstr(name + "_sum{group=\"1\",phase=\"backward\"} 0.125\n"));
    EXPECT_THAT(text, Not(HasSubstr("group=\"0\",phase=\"backward\"")));
    EXPECT_THAT(text, Not(HasSubstr("group=\"4\"")));
    EXPECT_THAT(text, Not(HasSubstr("phase=\"recal\"")));
  }
}

// Without groups the family is not there.
TEST_F(ServerMetricsTest, NoGroupWaitsWithoutGroups) {
  metrics_->GroupWait(0, ServerMetrics::kForward, absl::Seconds(1));
  EXPECT_THAT(registry_.TextExposition(),
              Not(HasSubstr("bnps_server_bn_group_barrier_wait_seconds")));
}

TEST_F(ServerMetricsTest, LayerSeriesAreBounded) {
  for (int i = 0; i < ServerMetrics::kMaxLayers; ++i) {
    metrics_->ForLayer(absl::StrCat("layer", i));
  }
  ServerMetrics::Layer* other = metrics_->ForLayer("one too many");
  EXPECT_EQ(other, metrics_->ForLayer("another"));
  other->Observe(ServerMetrics::kBackward, 0, absl::Milliseconds(1),
                 absl::ZeroDuration());
  EXPECT_THAT(registry_.TextExposition(),
              HasSubstr("layer=\"(other)\",phase=\"backward\""));
}

// A stream's cache of layer names holds at most kMaxLayers of them however
// many a client names, and names past it still reach their series (here
// the shared "(other)").
TEST_F(ServerMetricsTest, AStreamsLayerCacheIsBounded) {
  ServerMetrics::LayerCache cache(metrics_.get());
  ServerMetrics::Layer* first = cache.Get("layer0");
  EXPECT_EQ(first, metrics_->ForLayer("layer0"));
  for (int i = 0; i < 3 * ServerMetrics::kMaxLayers; ++i) {
    cache.Get(absl::StrCat("layer", i));
  }
  EXPECT_EQ(cache.size(), static_cast<size_t>(ServerMetrics::kMaxLayers));
  EXPECT_EQ(cache.Get("layer0"), first);
  EXPECT_EQ(cache.Get("never seen"), metrics_->ForLayer("(other)"));
  EXPECT_EQ(cache.size(), static_cast<size_t>(ServerMetrics::kMaxLayers));
}

TEST_F(ServerMetricsTest, CheckpointAgeOnceRecorded) {
  EXPECT_THAT(registry_.TextExposition(),
              Not(HasSubstr("\nbnps_server_checkpoint_age_seconds ")));
  metrics_->RecordCheckpoint(now_ - absl::Seconds(42));
  EXPECT_THAT(registry_.TextExposition(),
              HasSubstr("\nbnps_server_checkpoint_age_seconds 42\n"));
}

}  // namespace
}  // namespace bnps::server
