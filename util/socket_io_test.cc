#include "util/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace bnps::util {
namespace {

TEST(SocketIoTest, SendAllWritesEverythingOrSaysWhyNot) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  const std::string bytes(1000, 'b');
  ASSERT_TRUE(SendAll(fds[0], bytes.data(), bytes.size(),
                      absl::Now() + absl::Seconds(10))
                  .ok());
  std::string got(bytes.size(), '\0');
  ASSERT_EQ(read(fds[1], got.data(), got.size()),
            static_cast<ssize_t>(got.size()));
  EXPECT_EQ(got, bytes);
  // A peer that never reads: the socket's buffer fills, then the deadline.
  const std::string big(8 << 20, 'x');
  absl::Status s = SendAll(fds[0], big.data(), big.size(),
                           absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  // A peer gone: UNAVAILABLE, and no SIGPIPE.
  close(fds[1]);
  s = SendAll(fds[0], bytes.data(), bytes.size(),
              absl::Now() + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  close(fds[0]);
}

TEST(SocketIoTest, WaitReadableAndARefusedConnect) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  EXPECT_FALSE(WaitReadable(fds[0], absl::Now() + absl::Milliseconds(20)));
  ASSERT_EQ(write(fds[1], "x", 1), 1);
  EXPECT_TRUE(WaitReadable(fds[0], absl::Now() + absl::Seconds(10)));
  close(fds[0]);
  close(fds[1]);

  // A port nobody listens on (bound, never listening).
  const int idle = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(idle, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(idle, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int c = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_TRUE(SetLowLatency(c, "test").ok());
  const int r = connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  if (r != 0 && errno == EINPROGRESS) {
    const absl::Status s = FinishConnect(c, absl::Now() + absl::Seconds(10));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  } else {
    EXPECT_NE(r, 0);  // refused at once
  }
  close(c);
  close(idle);
}

TEST(SocketIoTest, ListenTcpTakesAFreePortAndRefusesATakenOne) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  absl::StatusOr<Listener> first = ListenTcp(addr, 4);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_GT(first->port, 0);
  EXPECT_NE(fcntl(first->fd, F_GETFL) & O_NONBLOCK, 0);
  // It listens: a client connects to the port it says.
  addr.sin_port = htons(static_cast<uint16_t>(first->port));
  const int c = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  close(c);
  // A second live listener on the same port is refused, naming it.
  absl::StatusOr<Listener> second = ListenTcp(addr, 4);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(
                "cannot listen on 127.0.0.1:" + std::to_string(first->port)),
            std::string::npos)
      << second.status();
  close(first->fd);
}

// A connection set up for BN finds a vanished peer on its own: keepalive
// probes after kKeepAliveIdleSeconds, and a bound on unacknowledged data.
TEST(SocketIoTest, LowLatencyConnectionsProbeASilentPeer) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_TRUE(SetLowLatency(fd, "test").ok());
  int v = 0;
  socklen_t len = sizeof v;
  ASSERT_EQ(getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, &len), 0);
  EXPECT_EQ(v, 1);
  ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &v, &len), 0);
  EXPECT_EQ(v, kKeepAliveIdleSeconds);
  ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &v, &len), 0);
  EXPECT_EQ(v, 3);
  unsigned timeout_ms = 0;
  len = sizeof timeout_ms;
  ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, &len), 0);
  EXPECT_EQ(timeout_ms, 8000u);
  close(fd);
}

}  // namespace
}  // namespace bnps::util
