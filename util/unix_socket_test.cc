#include "util/unix_socket.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace bnps::util {
namespace {

// Under /tmp: TEST_TMPDIR is often longer than a socket address holds.
std::string TempPath(const std::string& name) {
  return absl::StrCat("/tmp/bnps-test-", getpid(), "-", name);
}

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

TEST(UnixSocketTest, ListensConnectsAndRemovesItsPath) {
  const std::string path = TempPath("a.sock");
  absl::StatusOr<UnixListener> fd = ListenUnix(path, 8);
  ASSERT_TRUE(fd.ok()) << fd.status();
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  absl::StatusOr<int> c = ConnectUnix(path, Soon());
  ASSERT_TRUE(c.ok()) << c.status();
  const int a = accept(fd->fd, nullptr, nullptr);
  ASSERT_GE(a, 0);
  ASSERT_EQ(write(*c, "x", 1), 1);
  char got = 0;
  ASSERT_EQ(read(a, &got, 1), 1);
  EXPECT_EQ(got, 'x');
  close(a);
  close(*c);
  RemoveUnixListener(*fd, path);
  close(fd->fd);
  EXPECT_NE(lstat(path.c_str(), &st), 0);
}

TEST(UnixSocketTest, ReplacesAStaleSocketButNotALiveOne) {
  const std::string path = TempPath("stale.sock");
  absl::StatusOr<UnixListener> first = ListenUnix(path, 8);
  ASSERT_TRUE(first.ok()) << first.status();
  // A second server while the first listens: refused.
  absl::StatusOr<UnixListener> second = ListenUnix(path, 8);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  // The first dies without unlinking: its path is stale and is replaced.
  close(first->fd);
  absl::StatusOr<UnixListener> third = ListenUnix(path, 8);
  ASSERT_TRUE(third.ok()) << third.status();
  absl::StatusOr<int> c = ConnectUnix(path, Soon());
  EXPECT_TRUE(c.ok()) << c.status();
  if (c.ok()) close(*c);
  RemoveUnixListener(*third, path);
  close(third->fd);
}

TEST(UnixSocketTest, RefusesAPathThatIsNotASocket) {
  const std::string path = TempPath("file");
  const int f = open(path.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(f, 0);
  close(f);
  absl::StatusOr<UnixListener> fd = ListenUnix(path, 8);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kAlreadyExists);
  struct stat st;
  EXPECT_EQ(lstat(path.c_str(), &st), 0);  // left alone
  EXPECT_TRUE(S_ISREG(st.st_mode));
  unlink(path.c_str());
}

TEST(UnixSocketTest, ATooLongPathNamesTheLimit) {
  const std::string path = "/tmp/" + std::string(MaxUnixPathBytes(), 'x');
  absl::StatusOr<UnixListener> fd = ListenUnix(path, 8);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fd.status().message().find(absl::StrCat(MaxUnixPathBytes())),
            std::string::npos)
      << fd.status();
  EXPECT_EQ(ConnectUnix(path, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(UnixSocketTest, ConnectToAMissingPathIsUnavailable) {
  absl::StatusOr<int> c = ConnectUnix(TempPath("missing.sock"), Soon());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
}

TEST(UnixSocketTest, RemoveLeavesAnotherServersSocket) {
  const std::string path = TempPath("replaced.sock");
  absl::StatusOr<UnixListener> first = ListenUnix(path, 8);
  ASSERT_TRUE(first.ok()) << first.status();
  unlink(path.c_str());
  absl::StatusOr<UnixListener> second = ListenUnix(path, 8);
  ASSERT_TRUE(second.ok()) << second.status();
  RemoveUnixListener(*first, path);  // not first's any more
  close(first->fd);
  struct stat st;
  EXPECT_EQ(lstat(path.c_str(), &st), 0);
  RemoveUnixListener(*second, path);
  close(second->fd);
  EXPECT_NE(lstat(path.c_str(), &st), 0);
}

TEST(UnixSocketTest, APrivatePathIsInAFreshDirectoryOfThisUser) {
  absl::StatusOr<std::string> a = MakePrivateSocketPath(7312);
  absl::StatusOr<std::string> b = MakePrivateSocketPath(7312);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);  // not guessable from the pid and port
  EXPECT_NE(a->find(absl::StrCat("/", getpid(), "-7312.sock")), std::string::npos);
  EXPECT_LE(a->size(), MaxUnixPathBytes());
  const std::string dir = a->substr(0, a->rfind('/'));
  struct stat st;
  ASSERT_EQ(lstat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  RemovePrivateSocketDir(*a);
  RemovePrivateSocketDir(*b);
  EXPECT_NE(lstat(dir.c_str(), &st), 0);
}

}  // namespace
}  // namespace bnps::util
