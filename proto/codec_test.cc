#include "proto/codec.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace bnps::proto {
namespace {

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TEST(CodecTest, Float32RoundTripAsRawBytes) {
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  Tensor t;
  const int64_t shape[] = {2, 3};
  EncodeFloat32(v, shape, &t);
  EXPECT_EQ(t.data().size(), v.size() * 4);
  absl::StatusOr<std::vector<float>> back = DecodeFloat32(t, shape);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, v);
}

TEST(CodecTest, Float32RejectsBadTensors) {
  const std::vector<float> v = {1, 2, 3, 4};
  const int64_t shape[] = {2, 2};
  Tensor t;
  EncodeFloat32(v, shape, &t);
  const int64_t other[] = {4};
  EXPECT_EQ(DecodeFloat32(t, other).status().code(), kInvalid);  // shape
  Tensor bad = t;
  bad.set_dtype(DTYPE_FLOAT64);
  EXPECT_EQ(DecodeFloat32(bad).status().code(), kInvalid);  // dtype
  bad = t;
  bad.mutable_data()->pop_back();
  EXPECT_EQ(DecodeFloat32(bad).status().code(), kInvalid);  // truncated
  bad = t;
  bad.set_shape(0, -2);
  EXPECT_EQ(DecodeFloat32(bad).status().code(), kInvalid);  // negative dim
  bad = t;
  bad.set_shape(0, int64_t{1} << 40);
  EXPECT_EQ(DecodeFloat32(bad).status().code(), kInvalid);  // huge
  const std::vector<float> nan = {1, NAN, 3, 4};
  EncodeFloat32(nan, shape, &bad);
  EXPECT_EQ(DecodeFloat32(bad).status().code(), kInvalid);
  const std::vector<float> inf = {1, 2, -INFINITY, 4};
  EncodeFloat32(inf, shape, &bad);
  EXPECT_EQ(DecodeFloat32(bad).status().code(), kInvalid);
}

TEST(CodecTest, MomentsRoundTripAndValidation) {
  bn::Moments m;
  m.count = 12;
  m.mean = {1.0, -2.5, 1e4};
  m.m2 = {3.0, 0.0, 11.0};
  BnMoments wire;
  EncodeMoments(m, &wire);
  absl::StatusOr<bn::Moments> back = DecodeMoments(wire, 3);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->count, 12);
  EXPECT_EQ(back->mean, m.mean);
  EXPECT_EQ(back->m2, m.m2);
  EXPECT_EQ(DecodeMoments(wire, 4).status().code(), kInvalid);

  bn::Moments negative = m;
  negative.m2[1] = -1;
  EncodeMoments(negative, &wire);
  EXPECT_EQ(DecodeMoments(wire).status().code(), kInvalid);
  bn::Moments nan = m;
  nan.mean[0] = NAN;
  EncodeMoments(nan, &wire);
  EXPECT_EQ(DecodeMoments(wire).status().code(), kInvalid);
  EncodeMoments(m, &wire);
  wire.mutable_m2()->set_dtype(DTYPE_FLOAT32);
  EXPECT_EQ(DecodeMoments(wire).status().code(), kInvalid);
  EXPECT_EQ(DecodeMoments(BnMoments()).status().code(), kInvalid);
}

TEST(CodecTest, SumsAndRunningStats) {
  bn::BackwardSums s{{1, 2}, {3, 4}};
  BnSums wire;
  EncodeSums(s, &wire);
  absl::StatusOr<bn::BackwardSums> back = DecodeSums(wire, 2);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->sum_dy_xhat, s.sum_dy_xhat);
  EXPECT_EQ(DecodeSums(BnSums()).status().code(), kInvalid);
  // Non-finite sums cross as they are (bn::BackwardSums: a mixed-precision
  // step's overflow must reach every worker).
  const bn::BackwardSums overflowed{
      {std::numeric_limits<double>::infinity(), 1.0},
      {std::nan(""), -std::numeric_limits<double>::infinity()}};
  EncodeSums(overflowed, &wire);
  back = DecodeSums(wire, 2);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sum_dy, overflowed.sum_dy);
  EXPECT_TRUE(std::isnan(back->sum_dy_xhat[0]));
  EXPECT_EQ(back->sum_dy_xhat[1], overflowed.sum_dy_xhat[1]);

  bn::RunningStats r{{0.5}, {2.0}};
  BnRunningStats rw;
  EncodeRunning(r, &rw);
  ASSERT_TRUE(DecodeRunning(rw, 1).ok());
  // A variance must be finite and not negative; the error names the channel.
  for (double bad :
       {-1.0, std::nan(""), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::infinity()}) {
    bn::RunningStats r2{{0.5, 0.5}, {2.0, bad}};
    EncodeRunning(r2, &rw);
    absl::Status s = DecodeRunning(rw, 2).status();
    EXPECT_EQ(s.code(), kInvalid) << bad;
    EXPECT_THAT(s.message(), testing::HasSubstr("channel 1")) << s;
  }
  r.var[0] = -0.0;  // zero variance is allowed, whatever its sign
  EncodeRunning(r, &rw);
  EXPECT_TRUE(DecodeRunning(rw, 1).ok());
}

TEST(CodecTest, AppendChunksCutsAtTheLimit) {
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = i * 0.5f;
  const int64_t shape[] = {10, 100};
  google::protobuf::RepeatedPtrField<TensorChunk> chunks;
  AppendChunks("w", shape, v, 300, &chunks);
  ASSERT_EQ(chunks.size(), 4);
  std::vector<float> joined;
  for (const TensorChunk& c : chunks) {
    EXPECT_EQ(c.key(), "w");
    EXPECT_EQ(c.offset(), static_cast<int64_t>(joined.size()));
    EXPECT_EQ(std::vector<int64_t>(c.shape().begin(), c.shape().end()),
              (std::vector<int64_t>{10, 100}));
    absl::StatusOr<std::vector<float>> part = DecodeFloat32(c.part());
    ASSERT_TRUE(part.ok()) << part.status();
    joined.insert(joined.end(), part->begin(), part->end());
  }
  EXPECT_EQ(joined, v);
  EXPECT_EQ(chunks[3].part().shape(0), 100);
  // An empty tensor is one empty chunk.
  google::protobuf::RepeatedPtrField<TensorChunk> empty;
  const int64_t zero[] = {0};
  AppendChunks("e", zero, {}, 4, &empty);
  ASSERT_EQ(empty.size(), 1);
  EXPECT_EQ(empty[0].part().shape(0), 0);
}

TEST(CodecTest, StatusConversionKeepsCodeAndMessage) {
  const absl::Status s = absl::FailedPreconditionError("step 3 is from the past");
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(FromGrpcStatus(g), s);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(CodecTest, WireCodesRoundTripAndStrangeOnesAreUnknown) {
  const absl::Status s = absl::PermissionDeniedError("worker 1 is not you");
  EXPECT_EQ(WireCode(s), 7);
  EXPECT_EQ(StatusFromWire(WireCode(s), s.message()), s);
  EXPECT_EQ(WireCode(absl::OkStatus()), 0);
  EXPECT_TRUE(StatusFromWire(0, "ignored").ok());
  EXPECT_EQ(StatusFromWire(9, "stale", "BN_FORWARD of layer 'bn1'"),
            absl::FailedPreconditionError("BN_FORWARD of layer 'bn1': stale"));
  for (int code : {-1, 17, 1000}) {
    const absl::Status u = StatusFromWire(code, "what", "ctx");
    EXPECT_EQ(u.code(), absl::StatusCode::kUnknown) << code;
    EXPECT_EQ(u.message(), absl::StrCat("ctx: code ", code, ": what"));
  }
}

}  // namespace
}  // namespace bnps::proto
