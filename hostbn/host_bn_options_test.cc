#include "hostbn/host_bn_options.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/flags_testing.h"

namespace bnps::hostbn {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<HostBnOptions> Convert(
    std::initializer_list<std::pair<std::string, std::string>> flags) {
  util::ScopedFlags scoped;
  for (const auto& [name, value] : flags) {
    if (absl::Status s = scoped.Set(name, value); !s.ok()) return s;
  }
  return HostBnOptionsFromFlags();
}

TEST(HostBnOptionsTest, DefaultsServeOneLocalWorker) {
  absl::StatusOr<HostBnOptions> o = Convert({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->aggregator.host, "127.0.0.1");
  EXPECT_EQ(o->aggregator.port, 7200);
  EXPECT_EQ(o->aggregator.workers, 1);
  EXPECT_TRUE(o->aggregator.token.empty());
  EXPECT_FALSE(o->aggregator.per_worker_tokens);
  EXPECT_TRUE(o->aggregator.shards.empty());
  EXPECT_EQ(o->aggregator.metrics, nullptr);
}

TEST(HostBnOptionsTest, FlagsReachTheirFields) {
  const std::string path = absl::StrCat(testing::TempDir(), "/token");
  {
    std::ofstream out(path);
    out << "0123456789abcdef0123456789abcdef\n";
  }
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  absl::StatusOr<HostBnOptions> o = Convert({{"host", "10.0.0.5"},
                                             {"port", "0"},
                                             {"workers", "4"},
                                             {"token_file", path},
                                             {"per_worker_tokens", "true"},
                                             {"num_workers", "8"},
                                             {"shards", "a,,b:7100"}});
  std::remove(path.c_str());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->aggregator.host, "10.0.0.5");
  EXPECT_EQ(o->aggregator.port, 0);
  EXPECT_EQ(o->aggregator.workers, 4);
  EXPECT_EQ(o->aggregator.token, "0123456789abcdef0123456789abcdef");
  EXPECT_TRUE(o->aggregator.per_worker_tokens);
  EXPECT_EQ(o->aggregator.num_workers, 8);
  EXPECT_EQ(o->aggregator.shards, (std::set<std::string>{"a", "b:7100"}));
}

TEST(HostBnOptionsTest, BadFlagsAreRefused) {
  absl::StatusOr<HostBnOptions> token =
      Convert({{"token_file", "/nonexistent/token"}});
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token.status().message(), HasSubstr("/nonexistent/token"));
  absl::StatusOr<HostBnOptions> metrics = Convert({{"metrics_port", "70000"}});
  ASSERT_FALSE(metrics.ok());
  EXPECT_EQ(metrics.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(metrics.status().message(), HasSubstr("--metrics_port"));
}

}  // namespace
}  // namespace bnps::hostbn
