#include "util/json_string.h"

#include <string>

#include "gtest/gtest.h"

namespace bnps::util {
namespace {

TEST(JsonString, QuotesAndEscapes) {
  EXPECT_EQ(JsonString(""), "\"\"");
  EXPECT_EQ(JsonString("conv1.weight"), "\"conv1.weight\"");
  EXPECT_EQ(JsonString("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonString(std::string("n\nt\t\0z", 6)),
            "\"n\\u000at\\u0009\\u0000z\"");
  EXPECT_EQ(JsonString("caf\xc3\xa9"), "\"caf\xc3\xa9\"");  // UTF-8 as is
}

}  // namespace
}  // namespace bnps::util
