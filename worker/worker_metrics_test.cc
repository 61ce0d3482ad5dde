#include "worker/worker_metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/registry.h"

namespace bnps::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(WorkerMetricsTest, StepsSplitAndThroughput) {
  metrics::Registry registry;
  absl::Time now = absl::FromUnixSeconds(100);
  WorkerMetrics m(&registry, [&now] { return now; });
  m.StepDone(absl::Milliseconds(300), absl::Milliseconds(100),
             absl::Milliseconds(100), 32);
  now += absl::Milliseconds(500);  // not a second yet: no figure
  EXPECT_THAT(registry.TextExposition(),
              HasSubstr("\nbnps_worker_images_per_second 0\n"));
  m.StepDone(absl::Milliseconds(300), absl::Milliseconds(100),
             absl::Milliseconds(100), 32);
  now += absl::Milliseconds(1500);
  m.StepDone(absl::Milliseconds(300), absl::Milliseconds(100),
             absl::Milliseconds(100), 64);
  const std::string text = registry.TextExposition();
  EXPECT_THAT(text, HasSubstr("\nbnps_worker_images_per_second 64\n"));  // 128/2s
  EXPECT_THAT(text, HasSubstr("\nbnps_worker_steps_total 3\n"));
  EXPECT_THAT(text, HasSubstr("\nbnps_worker_examples_total 128\n"));
  EXPECT_THAT(text, HasSubstr("\nbnps_worker_step 3\n"));
  EXPECT_THAT(text, HasSubstr("bnps_worker_step_seconds_count{part=\"compute\"} 3\n"));
  // 300 ms computing, 100 ms syncing BN: buckets (0.256, 0.512] and
  // (0.064, 0.128].
  EXPECT_THAT(text, HasSubstr("{part=\"compute\",le=\"0.256\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("{part=\"compute\",le=\"0.512\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("{part=\"bn_sync\",le=\"0.064\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("{part=\"bn_sync\",le=\"0.128\"} 3\n"));
}

TEST(WorkerMetricsTest, BnRoundTripByLayerAndPhaseUsed) {
  metrics::Registry registry;
  WorkerMetrics m(&registry);
  m.BnRoundTrip("bn1", WorkerMetrics::kForward, absl::Milliseconds(2));
  m.BnRoundTrip("bn1", WorkerMetrics::kForward, absl::Milliseconds(4));
  m.BnRoundTrip("bn2", WorkerMetrics::kBackward, absl::Milliseconds(1));
  const std::string text = registry.TextExposition();
  EXPECT_THAT(text, HasSubstr("bnps_worker_bn_round_trip_seconds_count{layer="
                              "\"bn1\",phase=\"forward\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("bnps_worker_bn_round_trip_seconds_count{layer="
                              "\"bn2\",phase=\"backward\"} 1\n"));
  // A phase with no calls has no series.
  EXPECT_THAT(text, Not(HasSubstr("layer=\"bn1\",phase=\"backward\"")));
}

TEST(WorkerMetricsTest, RetriesByCode) {
  metrics::Registry registry;
  WorkerMetrics m(&registry);
  m.Retry(absl::StatusCode::kUnavailable);
  m.Retry(absl::StatusCode::kUnavailable);
  m.Retry(absl::StatusCode::kAborted);
  const std::string text = registry.TextExposition();
  EXPECT_THAT(text, HasSubstr("bnps_worker_retries_total{code=\"UNAVAILABLE\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("bnps_worker_retries_total{code=\"ABORTED\"} 1\n"));
}

}  // namespace
}  // namespace bnps::worker
