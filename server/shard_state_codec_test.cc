#include "server/shard_state_codec.h"

#include <string>

#include "gtest/gtest.h"

namespace bnps::server {
namespace {

proto::ShardCheckpoint TwoParams() {
  proto::ShardCheckpoint c;
  c.set_step(7);
  proto::ParamState* a = c.add_params();
  a->set_key("a");
  a->set_values(std::string(4000, 'v'));
  a->set_momentum(std::string(4000, 'm'));
  proto::ParamState* b = c.add_params();
  b->set_key("b");
  b->set_values("");  // an empty tensor is legal
  b->set_momentum("");
  return c;
}

TEST(ShardStateCodecTest, RoundTripsWithTheTensorsOutsideTheMessage) {
  const proto::ShardCheckpoint c = TwoParams();
  absl::StatusOr<std::string> payload = EncodeShardState(c, /*max_message_bytes=*/64);
  ASSERT_TRUE(payload.ok()) << payload.status();
  absl::StatusOr<proto::ShardCheckpoint> back = DecodeShardState(*payload, "f");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), c.SerializeAsString());
}

TEST(ShardStateCodecTest, AnOlderServersPayloadDecodes) {
  const proto::ShardCheckpoint c = TwoParams();
  absl::StatusOr<proto::ShardCheckpoint> back =
      DecodeShardState(c.SerializeAsString(), "f");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->params(0).values(), c.params(0).values());
}

TEST(ShardStateCodecTest, AMessageOverTheLimitIsRefusedNotEmptied) {
  proto::ShardCheckpoint c = TwoParams();
  for (int i = 0; i < 50; ++i) c.add_params()->set_key("key" + std::to_string(i));
  absl::StatusOr<std::string> payload = EncodeShardState(c, 64);
  EXPECT_EQ(payload.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(payload.status().message().find("more than a checkpoint's message"),
            std::string::npos)
      << payload.status();
}

TEST(ShardStateCodecTest, TensorsMustPair) {
  StatePieces pieces;
  EXPECT_EQ(EncodeShardState(TwoParams(), {"x"}, 1024, &pieces).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ShardStateCodecTest, TornOrPaddedPayloadsAreDataLoss) {
  const std::string payload = *EncodeShardState(TwoParams());
  for (size_t cut : {size_t{8}, size_t{12}, payload.size() - 1}) {
    const absl::Status s = DecodeShardState(payload.substr(0, cut), "f").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << cut;
  }
  const absl::Status padded = DecodeShardState(payload + "x", "f").status();
  EXPECT_EQ(padded.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(padded.message().find("after the last tensor"), std::string::npos);
  EXPECT_EQ(DecodeShardState("\xff\xff", "f").status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace bnps::server
