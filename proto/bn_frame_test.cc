#include "proto/bn_frame.h"

#include <string>

#include "gtest/gtest.h"
#include "proto/bnps.pb.h"
#include "proto/limits.h"

namespace bnps::proto {
namespace {

BnRequest Request(uint64_t id, const std::string& layer) {
  BnRequest r;
  r.set_id(id);
  r.set_layer(layer);
  r.set_step(7);
  r.set_phase(BN_FORWARD);
  return r;
}

TEST(BnFrameTest, FramesSurviveAnySplitOfTheBytes) {
  std::string bytes;
  ASSERT_TRUE(AppendFrame(Request(1, "conv1.bn"), &bytes).ok());
  ASSERT_TRUE(AppendFrame(BnRequest(), &bytes).ok());  // an empty message
  ASSERT_TRUE(AppendFrame(Request(3, std::string(300, 'x')), &bytes).ok());
  for (size_t piece : {size_t{1}, size_t{3}, size_t{7}, bytes.size()}) {
    FrameReader reader;
    std::vector<BnRequest> got;
    for (size_t at = 0; at < bytes.size(); at += piece) {
      reader.Append(bytes.data() + at, std::min(piece, bytes.size() - at));
      for (;;) {
        absl::StatusOr<std::optional<absl::string_view>> f = reader.Next();
        ASSERT_TRUE(f.ok()) << f.status();
        if (!f->has_value()) break;
        BnRequest r;
        ASSERT_TRUE(r.ParseFromArray((*f)->data(), (*f)->size()));
        got.push_back(r);
      }
    }
    ASSERT_EQ(got.size(), 3u) << "piece " << piece;
    EXPECT_EQ(got[0].id(), 1u);
    EXPECT_EQ(got[0].layer(), "conv1.bn");
    EXPECT_EQ(got[1].ByteSizeLong(), 0u);
    EXPECT_EQ(got[2].layer(), std::string(300, 'x'));
    EXPECT_EQ(reader.buffered(), 0u);
  }
}

TEST(BnFrameTest, ALengthAboveTheLimitIsNotAFrame) {
  FrameReader reader;
  const uint32_t n = kMaxMessageBytes + 1;
  const char header[4] = {static_cast<char>(n & 0xff),
                          static_cast<char>((n >> 8) & 0xff),
                          static_cast<char>((n >> 16) & 0xff),
                          static_cast<char>((n >> 24) & 0xff)};
  reader.Append(header, 4);
  EXPECT_EQ(reader.Next().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BnFrameTest, AHeaderAloneWaitsForItsPayload) {
  std::string bytes;
  ASSERT_TRUE(AppendFrame(Request(9, "l"), &bytes).ok());
  FrameReader reader;
  reader.Append(bytes.data(), bytes.size() - 1);
  absl::StatusOr<std::optional<absl::string_view>> f = reader.Next();
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->has_value());
  reader.Append(bytes.data() + bytes.size() - 1, 1);
  f = reader.Next();
  ASSERT_TRUE(f.ok() && f->has_value());
}

}  // namespace
}  // namespace bnps::proto
