#include "server/read_state.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "proto/codec.h"

namespace bnps::server {
namespace {

std::unique_ptr<Shard> AShard() {
  ShardOptions o;
  o.num_workers = 1;
  o.start_ticker = false;
  return *Shard::Create(o);
}

TEST(ReadStateTest, EverythingOnceInOrderWithinTheMessageSize) {
  std::unique_ptr<Shard> shard = AShard();
  std::vector<float> big(40);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 0.5f * i;
  ASSERT_TRUE(*shard->store().Init("a", {4, 10}, big));
  ASSERT_TRUE(*shard->store().Init("b", {0}, {}));
  BnState bn;
  bn.contributed = {false};
  BnState::Layer layer;
  layer.name = "bn";
  layer.channels = 9;
  layer.running = bn::RunningStats{std::vector<double>(9, 0.25),
                                   std::vector<double>(9, 2.0)};
  bn.layers.push_back(layer);
  ASSERT_TRUE(shard->bn().Import(bn, absl::OkStatus()).ok());

  const std::vector<proto::ReadStateResponse> messages =
      ReadStateMessages(*shard, 64);
  ASSERT_GT(messages.size(), 3u);
  EXPECT_EQ(messages[0].step(), 0);
  EXPECT_FALSE(messages[0].job_complete());
  std::vector<float> a;
  int b_chunks = 0;
  std::vector<double> mean, var;
  for (const proto::ReadStateResponse& m : messages) {
    EXPECT_LE(m.ByteSizeLong(), 64u + 200u);
    for (const proto::TensorChunk& c : m.chunks()) {
      std::vector<float> part = *proto::DecodeFloat32(c.part());
      if (c.key() == "a") {
        EXPECT_EQ(c.offset(), static_cast<int64_t>(a.size()));
        EXPECT_EQ(c.shape_size(), 2);
        a.insert(a.end(), part.begin(), part.end());
      } else {
        EXPECT_EQ(c.key(), "b");
        EXPECT_TRUE(part.empty());
        ++b_chunks;
      }
    }
    for (const proto::BnRunningChunk& c : m.bn()) {
      EXPECT_EQ(c.layer(), "bn");
      EXPECT_EQ(c.channels(), 9);
      EXPECT_EQ(c.offset(), static_cast<int64_t>(mean.size()));
      bn::RunningStats r = *proto::DecodeRunning(c.part());
      mean.insert(mean.end(), r.mean.begin(), r.mean.end());
      var.insert(var.end(), r.var.begin(), r.var.end());
    }
  }
  EXPECT_EQ(a, big);
  EXPECT_EQ(b_chunks, 1);  // an empty tensor still travels
  EXPECT_EQ(mean, std::vector<double>(9, 0.25));
  EXPECT_EQ(var, std::vector<double>(9, 2.0));
}

TEST(ReadStateTest, AnEmptyShardAnswersOneMessage) {
  std::unique_ptr<Shard> shard = AShard();
  const std::vector<proto::ReadStateResponse> messages =
      ReadStateMessages(*shard, 1 << 20);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].chunks_size(), 0);
  EXPECT_EQ(messages[0].bn_size(), 0);
}

}  // namespace
}  // namespace bnps::server
