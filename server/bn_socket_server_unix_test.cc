// The BN listener's Unix socket (BnSocketServer::Options::unix_path): the
// same hello, refusals and barrier as over TCP, the path's lifecycle (made
// 0600, removed on stop, a stale one replaced, a live one or a file
// refused) and a path too long for a socket address.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/bnps.pb.h"
#include "proto/codec.h"
#include "server/bn_socket_server.h"
#include "server/raw_bn_conn_testing.h"
#include "util/unix_socket.h"

namespace bnps::server {
namespace {

using bn_testing::RawConn;

constexpr char kToken[] = "bnps-test-token-0123456789abcdef";

// Under /tmp: TEST_TMPDIR is often longer than a socket address holds.
std::string SocketPath(const std::string& name) {
  return absl::StrCat("/tmp/bnps-test-", getpid(), "-", name);
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

class BnUnixSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardOptions o;
    o.num_workers = 2;
    absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(o);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = *std::move(shard);
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(shard_->Register(w, /*incarnation=*/100 + w).ok());
    }
  }
  absl::StatusOr<std::unique_ptr<BnSocketServer>> Start(
      const std::string& unix_path) {
    BnSocketServer::Options so;
    so.token = kToken;
    so.unix_path = unix_path;
    return BnSocketServer::Start(shard_.get(), nullptr, nullptr, so);
  }

  std::unique_ptr<Shard> shard_;
};

TEST_F(BnUnixSocketTest, AUnixAndATcpWorkerMeetAtOneBarrier) {
  const std::string path = SocketPath("barrier.sock");
  absl::StatusOr<std::unique_ptr<BnSocketServer>> server = Start(path);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->unix_path(), path);
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  RawConn a(path), b((*server)->port());
  ASSERT_EQ(a.Hello("bnps", 0, kToken).code(), 0);
  ASSERT_EQ(b.Hello("bnps", 1, kToken).code(), 0);
  const auto [ra, rb] = bn_testing::MeetAtTheBarrier(a, b, 7, 9);
  EXPECT_EQ(ra.code(), 0) << ra.message();
  EXPECT_EQ(ra.id(), 7u);
  EXPECT_EQ(ra.contributors(), 2);
  absl::StatusOr<bn::Moments> ma = proto::DecodeMoments(ra.moments(), 2);
  absl::StatusOr<bn::Moments> mb = proto::DecodeMoments(rb.moments(), 2);
  ASSERT_TRUE(ma.ok() && mb.ok());
  EXPECT_EQ(ma->mean, (std::vector<double>{2.0, 3.0}));
  EXPECT_EQ(ma->mean, mb->mean);
  EXPECT_EQ((*server)->accepted(), 2);
  EXPECT_EQ((*server)->accepted_unix(), 1);

  (*server)->Stop();
  EXPECT_EQ((*server)->unix_path(), "");
  EXPECT_FALSE(Exists(path));  // removed on a clean stop
}

TEST_F(BnUnixSocketTest, AWrongTokenIsAnsweredThenTheConnectionEnds) {
  const std::string path = SocketPath("token.sock");
  absl::StatusOr<std::unique_ptr<BnSocketServer>> server = Start(path);
  ASSERT_TRUE(server.ok()) << server.status();
  RawConn c(path);
  proto::BnHelloReply r = c.Hello("bnps", 0, "not-the-token-0123456789abcdefgh");
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(c.Receive(), std::nullopt);
}

TEST_F(BnUnixSocketTest, AStalePathIsReplacedALiveOneRefused) {
  const std::string path = SocketPath("stale.sock");
  // A socket file nobody listens on, as a killed server leaves it.
  absl::StatusOr<util::UnixListener> dead = util::ListenUnix(path, 1);
  ASSERT_TRUE(dead.ok()) << dead.status();
  close(dead->fd);
  ASSERT_TRUE(Exists(path));
  absl::StatusOr<std::unique_ptr<BnSocketServer>> server = Start(path);
  ASSERT_TRUE(server.ok()) << server.status();
  {
    RawConn c(path);
    EXPECT_EQ(c.Hello("bnps", 0, kToken).code(), 0);
  }
  // A second server on the live path: refused, and the first keeps it.
  absl::StatusOr<std::unique_ptr<BnSocketServer>> second = Start(path);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists)
      << second.status();
  EXPECT_TRUE(Exists(path));
  EXPECT_EQ((*server)->unix_path(), path);
  server->reset();
  EXPECT_FALSE(Exists(path));
}

TEST_F(BnUnixSocketTest, APathThatIsNotASocketIsLeftAloneAndRefused) {
  const std::string path = SocketPath("a-file");
  const int f = open(path.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(f, 0);
  close(f);
  absl::StatusOr<std::unique_ptr<BnSocketServer>> server = Start(path);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(server.status().message().find("not a socket"), std::string::npos)
      << server.status();
  EXPECT_TRUE(Exists(path));
  unlink(path.c_str());
}

TEST_F(BnUnixSocketTest, APathTooLongNamesTheLimit) {
  absl::StatusOr<std::unique_ptr<BnSocketServer>> server =
      Start("/tmp/" + std::string(200, 'x'));
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find(
                absl::StrCat("at most ", util::MaxUnixPathBytes())),
            std::string::npos)
      << server.status();
}

// "auto" puts the socket in a private directory of its own (0700, with a
// name nobody guesses), removed with it.
TEST_F(BnUnixSocketTest, AutoPicksAPathInAPrivateDirectory) {
  absl::StatusOr<std::unique_ptr<BnSocketServer>> server = Start("auto");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string path = (*server)->unix_path();
  EXPECT_TRUE(absl::EndsWith(path, absl::StrCat("/", getpid(), "-",
                                                (*server)->port(), ".sock")))
      << path;
  const std::string dir = path.substr(0, path.rfind('/'));
  struct stat st;
  ASSERT_EQ(lstat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, geteuid());
  RawConn c(path);
  EXPECT_EQ(c.Hello("bnps", 0, kToken).code(), 0);
  server->reset();
  EXPECT_FALSE(Exists(path));
  EXPECT_FALSE(Exists(dir));
}

}  // namespace
}  // namespace bnps::server
