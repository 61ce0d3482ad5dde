#include "util/log_escape.h"

#include <string>

#include "gtest/gtest.h"

namespace bnps::util {
namespace {

TEST(EscapeForLogTest, PrintableAsciiPassesUnchanged) {
  EXPECT_EQ(EscapeForLog("unknown key 'conv1/w' (shard 0)"),
            "unknown key 'conv1/w' (shard 0)");
  EXPECT_EQ(EscapeForLog(""), "");
}

TEST(EscapeForLogTest, LineBreaksCannotStartANewLine) {
  const std::string escaped =
      EscapeForLog("job 'evil\nbnps_server[0]: forged\r\n'");
  EXPECT_EQ(escaped, "job 'evil\\nbnps_server[0]: forged\\r\\n'");
  EXPECT_EQ(escaped.find('\n'), std::string::npos);
  EXPECT_EQ(escaped.find('\r'), std::string::npos);
}

TEST(EscapeForLogTest, ControlAndNonAsciiBytesBecomeHex) {
  EXPECT_EQ(EscapeForLog(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(EscapeForLog("\t\x1b[31m\x7f"), "\\t\\x1b[31m\\x7f");
  EXPECT_EQ(EscapeForLog("\xff\xfe"), "\\xff\\xfe");      // not UTF-8
  EXPECT_EQ(EscapeForLog("\xc3\xbc"), "\\xc3\\xbc");      // UTF-8 of u-umlaut
}

TEST(EscapeForLogTest, BackslashIsEscapedSoEscapesCannotBeForged) {
  // A client that sends the two characters '\' 'n' must not look like one
  // that sent a newline.
  EXPECT_EQ(EscapeForLog("a\\nb"), "a\\\\nb");
  EXPECT_NE(EscapeForLog("a\\nb"), EscapeForLog("a\nb"));
}

TEST(EscapeForLogTest, EveryByteGivesPrintableAscii) {
  for (int b = 0; b < 256; ++b) {
    const std::string escaped = EscapeForLog(std::string(1, static_cast<char>(b)));
    for (const char c : escaped) {
      EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "byte " << b << " -> " << escaped;
    }
  }
}

}  // namespace
}  // namespace bnps::util
