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

// A 1 MiB name from a client wrote a 4 MiB log line.
TEST(EscapeForLogTest, LongTextIsCutWithAMarker) {
  const std::string huge(1 << 20, '\x01');  // 4 bytes each, escaped
  const std::string out = EscapeForLog(huge);
  EXPECT_LE(out.size(), kMaxLogTextBytes + 32);
  EXPECT_EQ(out.substr(0, 8), "\\x01\\x01");
  // 2048 bytes of output are 512 input bytes: the rest is counted.
  EXPECT_EQ(out.substr(kMaxLogTextBytes),
            "...[" + std::to_string((1 << 20) - 512) + " more bytes]");
  EXPECT_EQ(EscapeForLog("abcdef", 3), "abc...[3 more bytes]");
  EXPECT_EQ(EscapeForLog("abc", 3), "abc");  // exactly the bound: not cut
  EXPECT_EQ(EscapeForLog(std::string(100, 'x')), std::string(100, 'x'));
}

}  // namespace
}  // namespace bnps::util
