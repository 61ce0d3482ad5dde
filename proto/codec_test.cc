#include "proto/codec.h"

#include <cmath>
#include <vector>

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

  bn::RunningStats r{{0.5}, {2.0}};
  BnRunningStats rw;
  EncodeRunning(r, &rw);
  ASSERT_TRUE(DecodeRunning(rw, 1).ok());
  r.var[0] = -1;
  EncodeRunning(r, &rw);
  EXPECT_EQ(DecodeRunning(rw, 1).status().code(), kInvalid);
}

TEST(CodecTest, ChunksReassemble) {
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = i * 0.5f;
  const int64_t shape[] = {10, 100};
  google::protobuf::RepeatedPtrField<TensorChunk> chunks;
  AppendChunks("w", shape, v, 300, &chunks);
  ASSERT_EQ(chunks.size(), 4);
  ChunkAssembler assembler;
  for (int i = 0; i < chunks.size(); ++i) {
    absl::StatusOr<std::optional<ChunkAssembler::Complete>> got =
        assembler.Add(chunks[i]);
    ASSERT_TRUE(got.ok()) << got.status();
    if (i + 1 < chunks.size()) {
      EXPECT_FALSE(got->has_value());
      EXPECT_TRUE(assembler.pending());
    } else {
      ASSERT_TRUE(got->has_value());
      EXPECT_EQ((*got)->key, "w");
      EXPECT_EQ((*got)->shape, (std::vector<int64_t>{10, 100}));
      EXPECT_EQ((*got)->values, v);
    }
  }
  EXPECT_FALSE(assembler.pending());
}

TEST(CodecTest, ChunkAssemblerRejectsDisorder) {
  std::vector<float> v(10, 1.0f);
  const int64_t shape[] = {10};
  google::protobuf::RepeatedPtrField<TensorChunk> chunks;
  AppendChunks("w", shape, v, 4, &chunks);
  ChunkAssembler a;
  ASSERT_TRUE(a.Add(chunks[0]).ok());
  EXPECT_EQ(a.Add(chunks[2]).status().code(), kInvalid);  // gap
  ChunkAssembler b;
  ASSERT_TRUE(b.Add(chunks[0]).ok());
  TensorChunk other = chunks[1];
  other.set_key("v");
  EXPECT_EQ(b.Add(other).status().code(), kInvalid);  // interleaved key
  ChunkAssembler c;
  TensorChunk too_long = chunks[0];
  const int64_t big[] = {20};
  EncodeFloat32(std::vector<float>(20, 1.0f), big, too_long.mutable_part());
  EXPECT_EQ(c.Add(too_long).status().code(), kInvalid);  // past the end
  ChunkAssembler d;
  TensorChunk no_key = chunks[0];
  no_key.clear_key();
  EXPECT_EQ(d.Add(no_key).status().code(), kInvalid);
}

TEST(CodecTest, EmptyTensorIsOneChunk) {
  const int64_t shape[] = {0};
  google::protobuf::RepeatedPtrField<TensorChunk> chunks;
  AppendChunks("e", shape, {}, 4, &chunks);
  ASSERT_EQ(chunks.size(), 1);
  ChunkAssembler a;
  auto got = a.Add(chunks[0]);
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_TRUE((*got)->values.empty());
}

TEST(CodecTest, StatusConversionKeepsCodeAndMessage) {
  const absl::Status s = absl::FailedPreconditionError("step 3 is from the past");
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(FromGrpcStatus(g), s);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace bnps::proto
