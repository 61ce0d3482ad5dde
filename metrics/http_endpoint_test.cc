#include "metrics/http_endpoint.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

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
