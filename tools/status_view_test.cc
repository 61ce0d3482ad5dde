#include "tools/status_view.h"

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bnps::tools {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ShardAnswer Answer() {
  ShardAnswer a;
  a.address = "127.0.0.1:7000";
  proto::StatusResponse& r = a.status.emplace();
  r.mutable_config()->set_job("demo");
  r.mutable_config()->set_num_workers(2);
  r.mutable_config()->set_num_shards(1);
  r.mutable_config()->set_policy(proto::POLICY_SYNC);
  r.set_pushes_applied(40);
  for (int w = 0; w < 2; ++w) {
    proto::WorkerStatus* ws = r.add_workers();
    ws->set_worker(w);
    ws->set_registered(true);
    ws->set_live(w == 0);
    ws->set_clock(-1);
    ws->set_step(w == 0 ? 12 : 9);
    ws->set_pushes(20);
    ws->set_ms_since_heartbeat(w == 0 ? 120 : 15300);
  }
  for (int i = 0; i < 10; ++i) {
    proto::BnLayerStatus* l = r.add_bn_layers();
    l->set_layer(i == 3 ? "a_very_long_layer_name/that/does/not/fit"
                        : "layer" + std::to_string(i));
    l->set_phase(proto::BN_FORWARD);
    l->set_messages(24);
    l->set_mean_wait_seconds(0.002);
    l->set_step(12);
    l->set_slowest_wait_seconds(i == 3 ? 0.75 : 0.001 * i);
  }
  return a;
}

// A pair that is not a --policy shorthand names both halves and the bound.
TEST(StatusViewTest, CrossedPairShowsBothHalves) {
  ShardAnswer a = Answer();
  a.status->mutable_config()->set_policy(proto::POLICY_SYNC);
  a.status->mutable_config()->set_gradients(proto::GRADIENTS_ASYNC);
  a.status->mutable_config()->set_staleness(2);
  EXPECT_THAT(FormatText({a}),
              HasSubstr("policy bn sync/grad async (staleness 2)"));
}

// BN groups and an exact BN staleness get a line; a job with neither has
// none.
TEST(StatusViewTest, ShowsBnGroupsAndAnExactStaleness) {
  EXPECT_THAT(FormatText({Answer()}), Not(HasSubstr("  BN groups")));
  EXPECT_THAT(FormatText({Answer()}), Not(HasSubstr("  BN staleness")));
  ShardAnswer a = Answer();
  a.status->mutable_config()->set_bn_group_size(2);
  EXPECT_THAT(FormatText({a}), HasSubstr("  BN groups of 2 consecutive workers\n"));
  a.status->mutable_config()->set_policy(proto::POLICY_ASYNC);
  a.status->mutable_config()->set_bn_staleness(3);
  EXPECT_THAT(FormatText({a}),
              HasSubstr("  BN groups of 2 consecutive workers, staleness "
                        "exactly 3 steps\n"));
  a.status->mutable_config()->set_bn_group_size(0);
  a.status->mutable_config()->set_bn_staleness(0);
  EXPECT_THAT(FormatText({a}), HasSubstr("  BN staleness exactly 0 steps\n"));
  a.status->mutable_config()->clear_bn_staleness();
  a.status->mutable_config()->set_bn_group_by_host(true);
  EXPECT_THAT(FormatText({a}), HasSubstr("  BN groups by host\n"));
}

// A resized job shows its membership history; a fixed one has no such line.
TEST(StatusViewTest, ResizedJobShowsItsMembership) {
  EXPECT_THAT(FormatText({Answer()}), Not(HasSubstr("membership")));
  ShardAnswer a = Answer();
  a.status->mutable_config()->set_num_workers(4);
  for (auto [from, w] : {std::pair<int64_t, int>{0, 2}, {4, 4}, {8, 2}}) {
    proto::MembershipSegment* m = a.status->mutable_config()->add_membership();
    m->set_from_step(from);
    m->set_num_workers(w);
  }
  EXPECT_THAT(FormatText({a}),
              HasSubstr("  membership 0:2,4:4,8:2 (FROM_STEP:WORKERS)\n"));
  EXPECT_THAT(FormatJson({a}), HasSubstr("\"membership\""));
}

TEST(StatusViewTest, TextFitsEightyColumnsAndShowsTheSlowestLayersFirst) {
  ShardAnswer down;
  down.address = "127.0.0.1:7001";
  down.error = "connection refused";
  const std::string text = FormatText({Answer(), down});
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    EXPECT_LE(line.size(), 80u) << line;
  }
  EXPECT_THAT(text, HasSubstr("job 'demo' shard 0/1, policy sync"));
  EXPECT_THAT(text, HasSubstr("  worker 0: live, step 12, pushes 20, last "
                              "heard 120ms ago\n"));
  EXPECT_THAT(text, HasSubstr("  worker 1: LOST, step 9, pushes 20, last heard "
                              "15.3s ago\n"));
  // The slowest layer comes first, its name cut; 8 of 10 shown.
  const size_t slowest = text.find("a_very_long_layer_name/~");
  ASSERT_NE(slowest, std::string::npos) << text;
  EXPECT_LT(slowest, text.find("layer9 "));
  EXPECT_THAT(text, HasSubstr("750.0ms"));
  EXPECT_THAT(text, HasSubstr("... 2 more"));
  EXPECT_THAT(text, Not(HasSubstr("layer0 ")));  // the fastest, left out
  EXPECT_THAT(text, HasSubstr("127.0.0.1:7001: unreachable (connection refused)"));
}

TEST(StatusViewTest, CompleteJobSaysSoAndShowsFinishedWorkers) {
  ShardAnswer a = Answer();
  a.status->set_job_complete(true);
  a.status->mutable_workers(0)->set_finished(true);
  a.status->mutable_workers(0)->set_live(false);
  const std::string text = FormatText({a});
  EXPECT_THAT(text, HasSubstr("  job complete: every worker finished"));
  EXPECT_THAT(text, HasSubstr("  worker 0: finished, step 12, pushes 20\n"));
  EXPECT_THAT(FormatText({Answer()}), Not(HasSubstr("job complete")));
}

TEST(StatusViewTest, JsonHasEveryServer) {
  ShardAnswer down;
  down.address = "host\"x";
  down.error = "no";
  const std::string json = FormatJson({Answer(), down});
  EXPECT_THAT(json, HasSubstr("{\"servers\": [{\"address\": \"127.0.0.1:7000\", "
                              "\"status\": {"));
  EXPECT_THAT(json, HasSubstr("\"pushes_applied\":\"40\""));
  EXPECT_THAT(json, HasSubstr("\"slowest_wait_seconds\":0.75"));
  EXPECT_THAT(json, HasSubstr("{\"address\": \"host\\\"x\", \"error\": \"no\"}"));
}

}  // namespace
}  // namespace bnps::tools
