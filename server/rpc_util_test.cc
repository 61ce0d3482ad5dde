#include "server/rpc_util.h"

#include "gtest/gtest.h"

namespace bnps::server {
namespace {

TEST(PeerHostTest, KeepsTheHostOfAnAddress) {
  EXPECT_EQ(PeerHost("ipv4:10.77.0.4:41234"), "10.77.0.4");
  EXPECT_EQ(PeerHost("ipv6:[::1]:41234"), "[::1]");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:41234"), "[::1]");
  EXPECT_EQ(PeerHost("unix:/tmp/s"), "unix:/tmp/s");
  EXPECT_EQ(PeerHost("ipv4:nocolon"), "ipv4:nocolon");
  EXPECT_EQ(PeerHost("weird\nname"), "weird\\nname");
}

}  // namespace
}  // namespace bnps::server
