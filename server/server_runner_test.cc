// RunningServer on 127.0.0.1: starting, and refusing an address in use.

#include "server/server_runner.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bnps::server {
namespace {

using ::testing::HasSubstr;

TEST(RunningServerTest, PortZeroPicksAFreePort) {
  absl::StatusOr<std::unique_ptr<RunningServer>> server =
      RunningServer::Start(ShardOptions(), "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
}

TEST(RunningServerTest, AddressInUseIsAnError) {
  // gRPC binds with SO_REUSEPORT by default: a second server on the same port
  // would start and the kernel would split the connections between the two
  // jobs.
  absl::StatusOr<std::unique_ptr<RunningServer>> first =
      RunningServer::Start(ShardOptions(), "127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<RunningServer>> second =
      RunningServer::Start(ShardOptions(), address);
  ASSERT_FALSE(second.ok()) << "a second server started on " << address;
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(address));
  EXPECT_THAT(second.status().message(), HasSubstr("in use"));
}

}  // namespace
}  // namespace bnps::server
