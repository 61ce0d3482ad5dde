#include "security/job_token.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace bnps::security {
namespace {

constexpr char kToken[] = "s3cret-token-of-job-7";

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path, std::ios::binary) << contents;
  ::chmod(path.c_str(), 0600);
  return path;
}

TEST(JobTokenTest, ValidatesLengthAndCharacters) {
  EXPECT_TRUE(ValidateToken(std::string(kMinTokenBytes, 'a')).ok());
  EXPECT_TRUE(ValidateToken(std::string(kMaxTokenBytes, '~')).ok());
  EXPECT_TRUE(ValidateToken(kToken).ok());
  for (const std::string& bad :
       {std::string(), std::string(kMinTokenBytes - 1, 'a'),
        std::string(kMaxTokenBytes + 1, 'a'), std::string(kToken) + " x",
        std::string(kToken) + "\t", std::string(kToken) + "\x7f",
        std::string(kToken) + "\xc3\xa9", std::string(kToken) + '\0'}) {
    EXPECT_EQ(ValidateToken(bad).code(), absl::StatusCode::kInvalidArgument)
        << "'" << bad << "'";
  }
}

TEST(JobTokenTest, ATokenFileOpenToEveryUserIsRefused) {
  const std::string path = WriteFile("mode", kToken);
  ASSERT_TRUE(ReadTokenFile(path).ok());
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);  // a group that must read it
  EXPECT_TRUE(ReadTokenFile(path).ok());
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  absl::Status s = ReadTokenFile(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("(mode 0644) is readable by every user: chmod 600 '" +
                             path + "'"),
            std::string::npos)
      << s;
  ASSERT_EQ(::chmod(path.c_str(), 0602), 0);
  s = ReadTokenFile(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("may be replaced by any user"), std::string::npos) << s;
  // Another owner's file (a container's mounted secret) read through its
  // "other" bits is that owner's choice.
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  ASSERT_EQ(::chown(path.c_str(), ::geteuid() + 1, -1), 0);
  EXPECT_TRUE(ReadTokenFile(path).ok());
}

TEST(JobTokenTest, ReadsATokenFile) {
  absl::StatusOr<std::string> t = ReadTokenFile(WriteFile("plain", kToken));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, kToken);
  // As `echo` or an editor writes it.
  t = ReadTokenFile(WriteFile("newline", absl::StrCat(kToken, "\n")));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, kToken);
}

TEST(JobTokenTest, RefusesBadTokenFilesWithoutEchoingThem) {
  absl::StatusOr<std::string> t = ReadTokenFile("/nonexistent/bnps/token");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("/nonexistent/bnps/token"),
            std::string::npos);
  const std::string secret = "hunter2-but-with-a-space in-it";
  const std::string path = WriteFile("spaced", secret);
  t = ReadTokenFile(path);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find(path), std::string::npos);
  EXPECT_EQ(t.status().message().find("hunter2"), std::string::npos);
  for (const std::string& bad :
       {std::string(), std::string("\n"), absl::StrCat(kToken, "\n\n"),
        absl::StrCat(kToken, "\r\n"), std::string(kMaxTokenBytes + 1, 'a'),
        std::string(100000, 'a')}) {
    EXPECT_EQ(ReadTokenFile(WriteFile("bad", bad)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad.size() << " bytes";
  }
}

TEST(JobTokenTest, ChecksTheTokenACallCarried) {
  // No token configured: every call passes.
  EXPECT_TRUE(CheckToken("", std::nullopt).ok());
  EXPECT_TRUE(CheckToken("", "anything").ok());
  EXPECT_TRUE(CheckToken(kToken, kToken).ok());
  const std::string token = kToken;
  const std::string longer = token + "x";  // outlives the views below
  for (const std::optional<absl::string_view> got :
       {std::optional<absl::string_view>(),
        std::optional<absl::string_view>(""),
        std::optional<absl::string_view>(
            absl::string_view(token).substr(0, token.size() - 1)),
        std::optional<absl::string_view>(longer),
        std::optional<absl::string_view>("s3cret-token-of-job-8")}) {
    const absl::Status s = CheckToken(token, got);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated)
        << (got ? *got : "(none)");
    // The answer never contains the expected token.
    EXPECT_EQ(s.message().find(token), std::string::npos);
  }
  EXPECT_NE(CheckToken(token, std::nullopt).message().find("bnps-token"),
            std::string::npos);
}

}  // namespace
}  // namespace bnps::security
