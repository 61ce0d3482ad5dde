#include "metrics/http_endpoint.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "httplib.h"

namespace bnps::metrics {
namespace {

class HttpEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Family<Counter>* pushes =
        registry_.AddCounter("bnps_test_pushes_total", "Pushes.", {"result"});
    pushes->WithLabels({"applied"})->Increment(3);
    pushes->WithLabels({"weird \"value\"\n"})->Increment();
    registry_.AddGauge("bnps_test_workers", "Workers.", {"state"})
        ->WithLabels({"live"})
        ->Set(2);
    Histogram* h = registry_
                       .AddHistogram("bnps_test_wait_seconds", "Waits.",
                                     {"layer", "phase"},
                                     ExponentialBuckets(1e-4, 4, 8))
                       ->WithLabels({"conv1/bn", "forward"});
    h->Observe(0.002);
    h->Observe(5);
    registry_.AddGauge("bnps_test_unset_seconds", "Never set.");
  }

  Registry registry_;
};

TEST_F(HttpEndpointTest, ServesTheExposition) {
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> e =
      HttpEndpoint::Start("127.0.0.1", 0, &registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_GT((*e)->port(), 0);
  httplib::Client client("127.0.0.1", (*e)->port());
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"),
            "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res->body, registry_.TextExposition());
  httplib::Result missing = client.Get("/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST_F(HttpEndpointTest, PortInUseIsAnError) {
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> a =
      HttpEndpoint::Start("127.0.0.1", 0, &registry_);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> b =
      HttpEndpoint::Start("127.0.0.1", (*a)->port(), &registry_);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(HttpEndpoint::Start("127.0.0.1", 70000, &registry_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(HttpEndpointTest, StopRightAfterStartReturns) {
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> e =
      HttpEndpoint::Start("127.0.0.1", 0, &registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  (*e)->Stop();
  (*e)->Stop();
}

// A raw connection to 127.0.0.1:port that sends nothing; -1 if none. A
// `nonblocking` one does not wait for the endpoint to take it (past the
// listen backlog, a blocking connect would wait for SYN retries).
int Idle(int port, bool nonblocking = false) {
  int fd = ::socket(AF_INET, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 &&
      ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 &&
      !(nonblocking && errno == EINPROGRESS)) {
    ::close(fd);
    return -1;
  }
  timeval tv{10, 0};  // bounds the reads below
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Connections that send nothing hold at most kMaxConnections places; the
// rest wait in the kernel's backlog. Once they go, scrapes are served again.
TEST_F(HttpEndpointTest, ConnectionsAreBounded) {
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> e =
      HttpEndpoint::Start("127.0.0.1", 0, &registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<int> idle;
  for (int i = 0; i < 3 * HttpEndpoint::kMaxConnections; ++i) {
    int fd = Idle((*e)->port(), /*nonblocking=*/true);
    ASSERT_GE(fd, 0) << errno;
    idle.push_back(fd);
  }
  // Samples until the endpoint holds its most (a loaded machine may take a
  // while to accept) and for half a second more, within 8 s. Idle ones are
  // closed after kIdleSeconds and backlog ones take their places, so the count
  // must reach the bound and never pass it.
  int most = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(8);
  auto until = deadline;
  while (std::chrono::steady_clock::now() < until) {
    most = std::max(most, (*e)->connections_held());
    if (most >= HttpEndpoint::kMaxConnections && until == deadline) {
      until = std::min(deadline, std::chrono::steady_clock::now() +
                                     std::chrono::milliseconds(500));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(most, HttpEndpoint::kMaxConnections);
  for (int fd : idle) ::close(fd);
  httplib::Client client("127.0.0.1", (*e)->port());
  client.set_read_timeout(30, 0);
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_LE((*e)->connections_held(), HttpEndpoint::kMaxConnections);
}

// A connection that sends nothing is closed by the endpoint after
// kIdleSeconds (well within the read's 10 s bound).
TEST_F(HttpEndpointTest, AnIdleConnectionIsClosed) {
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> e =
      HttpEndpoint::Start("127.0.0.1", 0, &registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  int fd = Idle((*e)->port());
  ASSERT_GE(fd, 0);
  const auto start = std::chrono::steady_clock::now();
  char c;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0);  // the endpoint's end of file
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::seconds(HttpEndpoint::kIdleSeconds + 5));
  ::close(fd);
}

// The exposition, as served, passes Prometheus's own linter.
TEST_F(HttpEndpointTest, PromtoolAcceptsTheExposition) {
  if (access("/usr/bin/promtool", X_OK) != 0) {
    GTEST_SKIP() << "promtool not installed (Debian package prometheus)";
  }
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> e =
      HttpEndpoint::Start("127.0.0.1", 0, &registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  httplib::Client client("127.0.0.1", (*e)->port());
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res);
  const std::string path = ::testing::TempDir() + "/metrics.txt";
  std::ofstream(path) << res->body;
  const std::string cmd =
      "/usr/bin/promtool check metrics < " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out << "\n" << res->body;
  EXPECT_EQ(out, "") << res->body;
}

}  // namespace
}  // namespace bnps::metrics
