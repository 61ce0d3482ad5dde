#include "server/server_options.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/job_flags.h"
#include "util/flags_testing.h"

namespace bnps::server {
namespace {

using ::testing::HasSubstr;

// The conversion of the flags, with `flags` set over the defaults.
absl::StatusOr<ServerOptions> Convert(
    std::initializer_list<std::pair<std::string, std::string>> flags) {
  util::ScopedFlags scoped;
  for (const auto& [name, value] : flags) {
    if (absl::Status s = scoped.Set(name, value); !s.ok()) return s;
  }
  return ServerOptionsFromFlags();
}

// The error of `flags`, which must not convert.
std::string ErrorOf(
    std::initializer_list<std::pair<std::string, std::string>> flags) {
  absl::StatusOr<ServerOptions> o = Convert(flags);
  EXPECT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(o.status().message());
}

TEST(ServerOptionsTest, DefaultsAreAPlaintextSyncShard) {
  absl::StatusOr<ServerOptions> o = Convert({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->host, "127.0.0.1");
  EXPECT_EQ(o->port, 7000);
  EXPECT_EQ(o->shard.job, "bnps");
  EXPECT_EQ(o->shard.shard, 0);
  EXPECT_EQ(o->shard.num_shards, 1);
  EXPECT_EQ(o->shard.num_workers, 1);
  EXPECT_EQ(o->shard.policy, policy::Policy::kSync);
  EXPECT_EQ(o->shard.gradients, policy::Gradients::kSync);
  EXPECT_EQ(o->shard.worker_loss, policy::WorkerLoss::kFail);
  EXPECT_FALSE(o->shard.membership.has_value());
  EXPECT_DOUBLE_EQ(o->shard.optimizer.learning_rate,
                   policy::kDefaultLearningRate);
  EXPECT_DOUBLE_EQ(o->shard.optimizer.momentum, policy::kDefaultMomentum);
  EXPECT_EQ(o->shard.barrier_timeout, absl::Seconds(60));
  EXPECT_EQ(o->security.credentials, nullptr);
  EXPECT_TRUE(o->security.token.empty());
  EXPECT_EQ(o->transport, "plaintext");
  EXPECT_EQ(o->latency.bn_port, -1);
  EXPECT_EQ(o->latency.keep_awake, absl::ZeroDuration());
  EXPECT_EQ(o->limits.bn_memory_budget_bytes, int64_t{256} << 20);
  EXPECT_EQ(o->limits.bn_frame_timeout, absl::Seconds(10));
  EXPECT_FALSE(o->keep_serving);
  EXPECT_FALSE(o->shard.on_job_complete);
}

TEST(ServerOptionsTest, FlagsReachTheirFields) {
  absl::StatusOr<ServerOptions> o = Convert({
      {"host", "0.0.0.0"},
      {"port", "7003"},
      {"job", "j"},
      {"shard", "1"},
      {"num_shards", "2"},
      {"num_workers", "4"},
      {"membership", "0:2,10:4"},
      {"policy", "async"},
      {"staleness", "3"},
      {"on_worker_loss", "shrink"},
      {"learning_rate", "0.5"},
      {"bn_momentum", "0.2"},
      {"barrier_timeout_ms", "1500"},
      {"heartbeat_timeout_ms", "250"},
      {"checkpoint_dir", "/tmp/ck"},
      {"checkpoint_every_steps", "5"},
      {"keep_awake_us", "2000"},
      {"bn_port", "0"},
      {"bn_unix_socket", "auto"},
      {"bn_max_connections", "100"},
      {"bn_max_unauthenticated_per_peer", "3"},
      {"bn_memory_budget_mb", "8"},
      {"bn_frame_timeout_ms", "500"},
      {"keep_serving", "true"},
  });
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->host, "0.0.0.0");
  EXPECT_EQ(o->port, 7003);
  EXPECT_EQ(o->shard.job, "j");
  EXPECT_EQ(o->shard.shard, 1);
  EXPECT_EQ(o->shard.num_shards, 2);
  EXPECT_EQ(o->shard.num_workers, 4);
  ASSERT_TRUE(o->shard.membership.has_value());
  EXPECT_EQ(o->shard.membership->ToString(), "0:2,10:4");
  EXPECT_EQ(o->shard.policy, policy::Policy::kAsync);
  EXPECT_EQ(o->shard.gradients, policy::Gradients::kAsync);
  EXPECT_EQ(o->shard.staleness, 3);
  EXPECT_EQ(o->shard.worker_loss, policy::WorkerLoss::kShrink);
  EXPECT_DOUBLE_EQ(o->shard.optimizer.learning_rate, 0.5);
  EXPECT_DOUBLE_EQ(o->shard.bn_momentum, 0.2);
  EXPECT_EQ(o->shard.barrier_timeout, absl::Milliseconds(1500));
  EXPECT_EQ(o->shard.heartbeat_timeout, absl::Milliseconds(250));
  EXPECT_EQ(o->shard.checkpoint_dir, "/tmp/ck");
  EXPECT_EQ(o->shard.checkpoint_every, 5);
  EXPECT_EQ(o->latency.keep_awake, absl::Milliseconds(2));
  EXPECT_EQ(o->latency.bn_port, 0);
  EXPECT_EQ(o->latency.bn_unix_path, "auto");
  EXPECT_EQ(o->limits.bn_max_connections, 100);
  EXPECT_EQ(o->limits.bn_max_unauthenticated_per_peer, 3);
  EXPECT_EQ(o->limits.bn_memory_budget_bytes, int64_t{8} << 20);
  EXPECT_EQ(o->limits.bn_frame_timeout, absl::Milliseconds(500));
  EXPECT_TRUE(o->keep_serving);
}

TEST(ServerOptionsTest, ATokenFileGivesTheTokenAndPerWorkerTokens) {
  const std::string path = absl::StrCat(testing::TempDir(), "/token");
  {
    std::ofstream out(path);
    out << "0123456789abcdef0123456789abcdef\n";
  }
  // A token readable by every user is refused.
  EXPECT_FALSE(Convert({{"token_file", path}}).ok());
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  absl::StatusOr<ServerOptions> o =
      Convert({{"token_file", path}, {"per_worker_tokens", "true"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->security.token, "0123456789abcdef0123456789abcdef");
  EXPECT_TRUE(o->security.per_worker_tokens);
  EXPECT_EQ(o->transport, "plaintext");
  std::remove(path.c_str());
}

TEST(ServerOptionsTest, EachBadFlagIsNamed) {
  EXPECT_THAT(ErrorOf({{"port", "70000"}}), HasSubstr("--port 70000"));
  EXPECT_THAT(ErrorOf({{"port", "-1"}}), HasSubstr("--port"));
  EXPECT_THAT(ErrorOf({{"per_worker_tokens", "true"}}),
              HasSubstr("--token_file"));
  EXPECT_THAT(ErrorOf({{"keep_awake_us", "-1"}}), HasSubstr("--keep_awake_us"));
  EXPECT_THAT(ErrorOf({{"bn_port", "70000"}}), HasSubstr("--bn_port 70000"));
  EXPECT_THAT(ErrorOf({{"bn_port", "-2"}}), HasSubstr("--bn_port"));
  EXPECT_THAT(ErrorOf({{"bn_max_unauthenticated_per_peer", "0"}}),
              HasSubstr("--bn_max_unauthenticated_per_peer"));
  EXPECT_THAT(ErrorOf({{"bn_max_connections", "-1"}}),
              HasSubstr("--bn_max_connections"));
  EXPECT_THAT(ErrorOf({{"bn_memory_budget_mb", "0"}}),
              HasSubstr("--bn_memory_budget_mb (0)"));
  EXPECT_THAT(ErrorOf({{"bn_frame_timeout_ms", "0"}}),
              HasSubstr("--bn_frame_timeout_ms (0)"));
  EXPECT_THAT(ErrorOf({{"metrics_port", "70000"}}), HasSubstr("--metrics_port"));
  EXPECT_THAT(ErrorOf({{"tls_key", "/nonexistent.key"}}), HasSubstr("cert"));
}

TEST(ServerOptionsTest, BadValuesOfTheJobFlagsAreRefused) {
  EXPECT_THAT(ErrorOf({{"policy", "bogus"}}), HasSubstr("unknown policy 'bogus'"));
  EXPECT_THAT(ErrorOf({{"policy", "async"}, {"gradients", "sync"}}),
              HasSubstr("--policy"));
  EXPECT_THAT(ErrorOf({{"on_worker_loss", "retry"}}),
              HasSubstr("unknown worker-loss action 'retry'"));
  EXPECT_FALSE(Convert({{"membership", "x"}}).ok());
}

TEST(ServerOptionsTest, SyncBnWithAsyncGradientsTakesNoCheckpoints) {
  EXPECT_TRUE(Convert({{"bn_policy", "sync"}, {"gradients", "async"}}).ok());
  EXPECT_THAT(ErrorOf({{"bn_policy", "sync"},
                       {"gradients", "async"},
                       {"checkpoint_dir", "/tmp/ck"}}),
              HasSubstr("--checkpoint_dir with --bn_policy=sync and "
                        "--gradients=async"));
}

TEST(ServerOptionsTest, TlsFilesNameTheTransport) {
  const std::string dir = "tests/testdata/tls/";
  absl::StatusOr<ServerOptions> tls = Convert(
      {{"tls_cert", dir + "server.pem"}, {"tls_key", dir + "server.key"}});
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_NE(tls->security.credentials, nullptr);
  EXPECT_EQ(tls->transport, "TLS");
  absl::StatusOr<ServerOptions> mutual =
      Convert({{"tls_cert", dir + "server.pem"},
               {"tls_key", dir + "server.key"},
               {"tls_client_ca", dir + "ca.pem"}});
  ASSERT_TRUE(mutual.ok()) << mutual.status();
  EXPECT_EQ(mutual->transport, "mutual TLS");
}

TEST(ServerOptionsTest, TheRawBnListenerIsPlaintextOnly) {
  const std::string dir = "tests/testdata/tls/";
  EXPECT_THAT(ErrorOf({{"bn_port", "0"},
                       {"tls_cert", dir + "server.pem"},
                       {"tls_key", dir + "server.key"}}),
              HasSubstr("--bn_port serves BN traffic in plaintext"));
  EXPECT_TRUE(Convert({{"bn_port", "0"}}).ok());
}

}  // namespace
}  // namespace bnps::server
