#include "tools/status_options.h"

#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/flags_testing.h"

namespace bnps::tools {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<StatusOptions> Convert(
    std::initializer_list<std::pair<std::string, std::string>> flags) {
  util::ScopedFlags scoped;
  for (const auto& [name, value] : flags) {
    if (absl::Status s = scoped.Set(name, value); !s.ok()) return s;
  }
  return StatusOptionsFromFlags();
}

std::string ErrorOf(
    std::initializer_list<std::pair<std::string, std::string>> flags) {
  absl::StatusOr<StatusOptions> o = Convert(flags);
  EXPECT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(o.status().message());
}

TEST(StatusOptionsTest, DefaultsReadOneLocalServerOnce) {
  absl::StatusOr<StatusOptions> o = Convert({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->reader.servers, std::vector<std::string>{"127.0.0.1:7000"});
  EXPECT_EQ(o->reader.job, "bnps");
  EXPECT_EQ(o->reader.timeout, absl::Seconds(3));
  EXPECT_EQ(o->reader.credentials, nullptr);
  EXPECT_TRUE(o->reader.token.empty());
  EXPECT_FALSE(o->watch);
  EXPECT_FALSE(o->json);
  EXPECT_FALSE(o->digest);
  EXPECT_TRUE(o->export_path.empty());
  EXPECT_EQ(o->interval_s, 2);
  EXPECT_EQ(o->count, 0);
}

TEST(StatusOptionsTest, FlagsReachTheirFields) {
  absl::StatusOr<StatusOptions> o = Convert({{"servers", "a:1,,b:2"},
                                             {"job", "j"},
                                             {"timeout_ms", "250"},
                                             {"watch", "true"},
                                             {"interval_s", "0.5"},
                                             {"count", "3"},
                                             {"digest", "true"},
                                             {"export", "/tmp/m.safetensors"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->reader.servers, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(o->reader.job, "j");
  EXPECT_EQ(o->reader.timeout, absl::Milliseconds(250));
  EXPECT_TRUE(o->watch);
  EXPECT_EQ(o->interval_s, 0.5);
  EXPECT_EQ(o->count, 3);
  EXPECT_TRUE(o->digest);
  EXPECT_EQ(o->export_path, "/tmp/m.safetensors");
}

TEST(StatusOptionsTest, TlsFilesGiveCredentials) {
  const std::string dir = "tests/testdata/tls/";
  absl::StatusOr<StatusOptions> o = Convert({{"tls_ca", dir + "ca.pem"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_NE(o->reader.credentials, nullptr);
}

TEST(StatusOptionsTest, EachBadFlagIsNamed) {
  EXPECT_THAT(ErrorOf({{"servers", ","}}), HasSubstr("--servers is empty"));
  EXPECT_THAT(ErrorOf({{"interval_s", "0"}}), HasSubstr("--interval_s"));
  EXPECT_THAT(ErrorOf({{"count", "-1"}}), HasSubstr("--count >= 0"));
  EXPECT_THAT(ErrorOf({{"watch", "true"}, {"json", "true"}}),
              HasSubstr("--watch and --json do not go together"));
  EXPECT_FALSE(Convert({{"token_file", "/nonexistent/token"}}).ok());
}

}  // namespace
}  // namespace bnps::tools
