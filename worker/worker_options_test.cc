#include "worker/worker_options.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/policy.h"
#include "util/flags_testing.h"

namespace bnps::worker {
namespace {

using ::testing::HasSubstr;

using Flags = std::initializer_list<std::pair<std::string, std::string>>;

// The conversion of the flags, with `flags` set over the defaults.
absl::StatusOr<WorkerOptions> Convert(Flags flags) {
  util::ScopedFlags scoped;
  for (const auto& [name, value] : flags) {
    if (absl::Status s = scoped.Set(name, value); !s.ok()) return s;
  }
  return WorkerOptionsFromFlags();
}

// The error of `flags` with --servers set, which must not convert.
std::string ErrorOf(Flags flags) {
  util::ScopedFlags scoped;
  EXPECT_TRUE(scoped.Set("servers", "127.0.0.1:7000").ok());
  absl::StatusOr<WorkerOptions> o = Convert(flags);
  EXPECT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(o.status().message());
}

// The servers' configuration of a plain sync job.
proto::JobConfig SyncConfig() {
  proto::JobConfig c;
  policy::ToConfig(policy::JobPolicy{}, &c);
  c.set_learning_rate(0.1);
  c.set_momentum(0.9);
  return c;
}

TEST(WorkerOptionsTest, ServersAreRequired) {
  absl::StatusOr<WorkerOptions> o = Convert({});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(), HasSubstr("--servers is required"));
}

TEST(WorkerOptionsTest, DefaultsTrainWorkerZeroOnTheCpuOrAGpu) {
  absl::StatusOr<WorkerOptions> o =
      Convert({{"servers", "127.0.0.1:7000,127.0.0.1:7001"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->servers,
            (std::vector<std::string>{"127.0.0.1:7000", "127.0.0.1:7001"}));
  EXPECT_EQ(o->worker, 0);
  EXPECT_EQ(o->num_workers, 1);
  EXPECT_EQ(o->threads, 1);
  EXPECT_EQ(o->replicas, 1);
  EXPECT_EQ(o->progress, "auto");
  EXPECT_EQ(o->model.architecture, nn::Architecture::kCnn);
  EXPECT_EQ(o->model.depth, 1);
  EXPECT_EQ(o->model.width, 16);
  EXPECT_EQ(o->data, "fashion-mnist");
  EXPECT_EQ(o->data_dir, "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(o->devices.device, "auto");
  EXPECT_EQ(o->devices.gpu, -1);
  EXPECT_EQ(o->client.servers, o->servers);
  EXPECT_EQ(o->client.job, "bnps");
  EXPECT_EQ(o->client.connect_timeout, absl::Seconds(30));
  EXPECT_EQ(o->client.rpc_timeout, absl::Seconds(60));
  EXPECT_TRUE(o->client.bn_over_tcp);
  EXPECT_EQ(o->trainer.batch_size, 32);
  EXPECT_EQ(o->trainer.epochs, 1);
  EXPECT_EQ(o->trainer.recal_mode, RecalMode::kPrecise);
  EXPECT_TRUE(o->trainer.evaluate);  // --eval=first, worker 0
  EXPECT_TRUE(o->trainer.overlap);
  EXPECT_TRUE(o->report_path.empty());
}

TEST(WorkerOptionsTest, FlagsReachTheirFields) {
  absl::StatusOr<WorkerOptions> o = Convert({
      {"servers", "a:1"},
      {"worker", "2"},
      {"num_workers", "3"},
      {"job", "j"},
      {"threads", "2"},
      {"replicas", "2"},
      {"device", "cpu"},
      {"data", "synthetic"},
      {"model", "fc_bn"},
      {"depth", "2"},
      {"width", "4"},
      {"recal_mode", "exact"},
      {"eval", "first"},
      {"progress", "none"},
      {"batch_size", "8"},
      {"max_steps", "5"},
      {"seed", "7"},
      {"overlap", "false"},
      {"layer_pull", "true"},
      {"connect_timeout_s", "2.5"},
      {"rpc_timeout_s", "9"},
      {"bn_over_tcp", "false"},
      {"bn_host_aggregator", "h:7200"},
      {"metrics_linger_s", "1.5"},
      {"progress_interval_s", "0.5"},
  });
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->worker, 2);
  EXPECT_EQ(o->num_workers, 3);
  EXPECT_EQ(o->client.worker, 2);
  EXPECT_EQ(o->client.num_workers, 3);
  EXPECT_EQ(o->client.job, "j");
  EXPECT_EQ(o->threads, 2);
  EXPECT_EQ(o->replicas, 2);
  EXPECT_EQ(o->devices.device, "cpu");
  EXPECT_EQ(o->devices.replicas, 2);
  EXPECT_EQ(o->data, "synthetic");
  EXPECT_EQ(o->model.architecture, nn::Architecture::kFcBn);
  EXPECT_EQ(o->model.depth, 2);
  EXPECT_EQ(o->model.width, 4);
  EXPECT_EQ(o->trainer.recal_mode, RecalMode::kExact);
  EXPECT_FALSE(o->trainer.evaluate);  // --eval=first, not worker 0
  EXPECT_EQ(o->progress, "none");
  EXPECT_EQ(o->trainer.batch_size, 8);
  EXPECT_EQ(o->trainer.max_steps, 5);
  EXPECT_EQ(o->trainer.seed, 7u);
  EXPECT_FALSE(o->trainer.overlap);
  EXPECT_TRUE(o->trainer.layer_pull);
  EXPECT_EQ(o->trainer.progress_interval, absl::Milliseconds(500));
  EXPECT_EQ(o->client.connect_timeout, absl::Milliseconds(2500));
  EXPECT_EQ(o->client.rpc_timeout, absl::Seconds(9));
  EXPECT_FALSE(o->client.bn_over_tcp);
  EXPECT_EQ(o->client.bn_host_aggregator, "h:7200");
  EXPECT_DOUBLE_EQ(o->metrics_linger_s, 1.5);
}

TEST(WorkerOptionsTest, TheEnvironmentNamesTheLocalRank) {
  ASSERT_EQ(setenv("LOCAL_RANK", "3", 1), 0);
  absl::StatusOr<WorkerOptions> o = Convert({{"servers", "a:1"}});
  unsetenv("LOCAL_RANK");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->devices.local_rank, "3");
}

TEST(WorkerOptionsTest, EachBadFlagIsNamed) {
  EXPECT_THAT(ErrorOf({{"num_workers", "0"}}), HasSubstr("--num_workers"));
  EXPECT_THAT(ErrorOf({{"worker", "4"}, {"num_workers", "4"}}),
              HasSubstr("--worker=4 is outside [0, --num_workers=4)"));
  EXPECT_THAT(ErrorOf({{"threads", "0"}}), HasSubstr("--threads"));
  EXPECT_THAT(ErrorOf({{"replicas", "65"}}), HasSubstr("--replicas"));
  EXPECT_THAT(ErrorOf({{"bn_spin_us", "-2"}}), HasSubstr("--bn_spin_us"));
  EXPECT_THAT(ErrorOf({{"batch_size", "0"}}), HasSubstr("--batch_size"));
  EXPECT_THAT(ErrorOf({{"epochs", "0"}}), HasSubstr("--epochs"));
  EXPECT_THAT(ErrorOf({{"max_steps", "-1"}}), HasSubstr("--max_steps"));
  EXPECT_THAT(ErrorOf({{"eval", "some"}}), HasSubstr("--eval=some"));
  EXPECT_THAT(ErrorOf({{"progress", "bar"}}), HasSubstr("--progress=bar"));
  EXPECT_THAT(ErrorOf({{"connect_timeout_s", "0"}}),
              HasSubstr("--connect_timeout_s"));
  EXPECT_THAT(ErrorOf({{"rpc_timeout_s", "0"}}), HasSubstr("--rpc_timeout_s"));
  EXPECT_THAT(ErrorOf({{"progress_interval_s", "0"}}),
              HasSubstr("--progress_interval_s"));
  EXPECT_THAT(ErrorOf({{"recal_mode", "rough"}}), HasSubstr("rough"));
  EXPECT_THAT(ErrorOf({{"model", "mlp"}}), HasSubstr("--model: "));
  EXPECT_THAT(ErrorOf({{"depth", "65"}}), HasSubstr("--depth/--width: depth 65"));
  EXPECT_THAT(ErrorOf({{"width", "0"}}), HasSubstr("--depth/--width: width 0"));
  EXPECT_THAT(ErrorOf({{"report", "/nonexistent/dir/report.json"}}),
              HasSubstr("cannot write the report to /nonexistent/dir"));
  EXPECT_THAT(ErrorOf({{"metrics_port", "70000"}}), HasSubstr("--metrics_port"));
  EXPECT_THAT(ErrorOf({{"metrics_linger_s", "-1"}}),
              HasSubstr("--metrics_linger_s"));
  EXPECT_THAT(ErrorOf({{"data", "cifar"}}),
              HasSubstr("--data=cifar is not one of fashion-mnist, synthetic"));
}

TEST(WorkerOptionsTest, UngivenJobFlagsTakeTheServers) {
  absl::StatusOr<WorkerOptions> o = Convert({{"servers", "a:1"}});
  ASSERT_TRUE(o.ok()) << o.status();
  proto::JobConfig async;
  policy::ToConfig(policy::JobPolicy{policy::Policy::kAsync,
                                     policy::Gradients::kAsync},
                   &async);
  async.set_staleness(4);
  async.set_learning_rate(0.3);
  EXPECT_TRUE(CheckAgainstServers(o->given, async).ok());
  ASSERT_TRUE(o->client.check_config);
  EXPECT_TRUE(o->client.check_config(async).ok());
}

TEST(WorkerOptionsTest, GivenJobFlagsMustMatchTheServers) {
  absl::StatusOr<WorkerOptions> o = Convert({{"servers", "a:1"},
                                             {"policy", "sync"},
                                             {"staleness", "2"},
                                             {"learning_rate", "0.1"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->given.policy, "sync");
  EXPECT_EQ(o->given.staleness, 2);
  proto::JobConfig c = SyncConfig();
  absl::Status s = o->client.check_config(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("--staleness=2 but the servers run staleness 0"));
  c.set_staleness(2);
  EXPECT_TRUE(o->client.check_config(c).ok());
  c.set_learning_rate(0.2);
  EXPECT_THAT(o->client.check_config(c).message(),
              HasSubstr("--learning_rate=0.1 but the servers run"));
  proto::JobConfig async = SyncConfig();
  policy::ToConfig(policy::JobPolicy{policy::Policy::kAsync,
                                     policy::Gradients::kAsync},
                   &async);
  EXPECT_THAT(CheckAgainstServers(o->given, async).message(),
              HasSubstr("--policy=sync but the servers run policy async"));
}

// --bn_staleness: given, it must be the servers'; and the servers' may not
// be as long as this worker's run.
TEST(WorkerOptionsTest, AnExactBnStalenessMatchesAndFitsTheRun) {
  absl::StatusOr<WorkerOptions> o = Convert(
      {{"servers", "a:1"}, {"bn_staleness", "3"}, {"max_steps", "3"}});
  ASSERT_TRUE(o.ok()) << o.status();
  proto::JobConfig c = SyncConfig();
  EXPECT_THAT(o->client.check_config(c).message(),
              HasSubstr("--bn_staleness=3 but the servers run bn_staleness "
                        "none (the bounded mode)"));
  c.set_bn_staleness(3);
  EXPECT_THAT(o->client.check_config(c).message(),
              HasSubstr("no step would see the other workers' moments"));
  EXPECT_TRUE(CheckRunLength(c, 4).ok());
  EXPECT_TRUE(CheckRunLength(c, 0).ok());  // no --max_steps: the epochs'
}

// --bn_group=host: given, the servers must group by host too; --bn_host
// names the host the client registers from.
TEST(WorkerOptionsTest, BnGroupByHostMatchesTheServers) {
  absl::StatusOr<WorkerOptions> o = Convert(
      {{"servers", "a:1"}, {"bn_group", "host"}, {"bn_host", "node-7"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->client.host, "node-7");
  proto::JobConfig c = SyncConfig();
  EXPECT_THAT(o->client.check_config(c).message(),
              HasSubstr("--bn_group=host but the servers run bn_group none"));
  c.set_bn_group_by_host(true);
  EXPECT_TRUE(o->client.check_config(c).ok());
  absl::StatusOr<WorkerOptions> bad =
      Convert({{"servers", "a:1"}, {"bn_group", "rack"}});
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_THAT(bad->client.check_config(c).message(), HasSubstr("--bn_group"));
}

}  // namespace
}  // namespace bnps::worker
