// bnps_resolve_policy: policy::ResolvePolicy's answers and errors through
// the C ABI's conventions (status code, message in `err`, JSON out).

#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "python/native/bnps_c.h"

namespace {

struct Answer {
  int code;
  std::string json;
  std::string err;
};

Answer Resolve(const char* policy, const char* bn_policy,
               const char* gradients, size_t len = 1024) {
  std::string json(len, 'x');
  char err[256];
  std::memset(err, 'y', sizeof(err));
  const int code = bnps_resolve_policy(policy, bn_policy, gradients,
                                       json.data(), len, err, sizeof(err));
  return {code, code == 0 ? std::string(json.c_str()) : "",
          code == 0 ? "" : std::string(err)};
}

constexpr char kLists[] =
    ", \"policies\": [\"sync\", \"async\", \"recal\", \"local\"], "
    "\"gradient_modes\": [\"sync\", \"async\"]}";

TEST(BnpsResolvePolicyTest, NothingGivenIsSyncWithTheChoices) {
  for (const char* none : {static_cast<const char*>(nullptr), ""}) {
    Answer a = Resolve(none, none, none);
    ASSERT_EQ(a.code, 0) << a.err;
    EXPECT_EQ(a.json, std::string("{\"bn_policy\": \"sync\", \"gradients\": "
                                  "\"sync\", \"name\": \"sync\", \"flags\": "
                                  "[\"--policy=sync\"]") + kLists);
  }
}

TEST(BnpsResolvePolicyTest, ShorthandsAndOtherPairs) {
  Answer a = Resolve("async", nullptr, nullptr);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.json, std::string("{\"bn_policy\": \"async\", \"gradients\": "
                                "\"async\", \"name\": \"async\", \"flags\": "
                                "[\"--policy=async\"]") + kLists);
  a = Resolve("", "async", "sync");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.json,
            std::string("{\"bn_policy\": \"async\", \"gradients\": \"sync\", "
                        "\"name\": \"bn_policy=async,gradients=sync\", "
                        "\"flags\": [\"--bn_policy=async\", "
                        "\"--gradients=sync\"]") + kLists);
  a = Resolve(nullptr, "recal", nullptr);  // a shorthand pair, named so
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.json.find("\"name\": \"recal\", \"flags\": [\"--policy=recal\"]"),
            std::string::npos) << a.json;
}

TEST(BnpsResolvePolicyTest, UnknownNamesAndContradictionsAreInvalidArgument) {
  Answer a = Resolve("fast", nullptr, nullptr);
  EXPECT_EQ(a.code, 3);  // INVALID_ARGUMENT
  EXPECT_EQ(a.err,
            "unknown policy 'fast'; expected sync, async, recal or local");
  a = Resolve("recal", nullptr, "async");
  EXPECT_EQ(a.code, 3);
  EXPECT_EQ(a.err, "--policy=recal means --gradients=sync, not async; give "
                   "--bn_policy and --gradients alone");
  EXPECT_EQ(Resolve(nullptr, nullptr, "bulk").code, 3);
}

TEST(BnpsResolvePolicyTest, ASmallBufferIsResourceExhaustedAndTruncatesErr) {
  Answer a = Resolve("sync", nullptr, nullptr, 16);
  EXPECT_EQ(a.code, 8);  // RESOURCE_EXHAUSTED
  EXPECT_NE(a.err.find("bytes"), std::string::npos) << a.err;
  char err[8];
  EXPECT_EQ(bnps_resolve_policy("fast", nullptr, nullptr, nullptr, 0, err,
                                sizeof(err)),
            3);
  EXPECT_STREQ(err, "unknown");  // 7 bytes and the NUL
  EXPECT_EQ(bnps_resolve_policy("fast", nullptr, nullptr, nullptr, 0, nullptr,
                                0),
            3);
}

}  // namespace
