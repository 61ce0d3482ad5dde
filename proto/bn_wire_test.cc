#include "proto/bn_wire.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "proto/bnps.pb.h"
#include "proto/codec.h"
#include "proto/wire_testing.h"

namespace bnps::proto {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// FrameBnId(id) in front of `message`, as the stream sends them.
grpc::ByteBuffer WithId(uint64_t id, grpc::Slice message) {
  grpc::Slice slices[] = {FrameBnId(id), message};
  return grpc::ByteBuffer(slices, 2);
}

// The doubles' bits, so that -0.0 and 0.0 differ and equality is bitwise.
std::vector<uint64_t> Bits(const std::vector<double>& v) {
  std::vector<uint64_t> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(double));
  return out;
}

// `c` values that use every bit of a double (thirds), of both signs unless
// `positive`, scaled by `scale`.
std::vector<double> Values(int c, double scale, bool positive = false) {
  std::vector<double> v;
  for (int i = 0; i < c; ++i) {
    v.push_back((positive || i % 2 == 0 ? scale : -scale) * (i + 1) / 3.0);
  }
  return v;
}
bn::Moments SomeMoments(int c, int64_t count) {
  bn::Moments m{count, Values(c, 1.0), Values(c, 1e3 / 7, true)};
  if (c > 1) m.mean[1] = -0.0;
  if (c > 2) m.m2[2] = std::numeric_limits<double>::denorm_min();
  return m;
}
bn::BackwardSums SomeSums(int c) {
  return {Values(c, -1e-300), Values(c, 1e200)};
}
bn::RunningStats SomeRunning(int c) {
  return {Values(c, 5.0), Values(c, 1.0 / 7, true)};
}

BnRequest RequestHead() {
  BnRequest head;
  head.set_job("job-7");
  head.set_worker(7);
  head.set_step(int64_t{1} << 40);
  head.set_layer("block3/bn2");
  head.set_phase(BN_FORWARD);
  head.set_want_running(true);
  return head;
}

// A BnRequest with every field set, built by the generated classes.
BnRequest FullRequest(int c, int64_t count) {
  BnRequest m = RequestHead();
  m.set_id(0xfedcba9876543210u);
  EncodeMoments(SomeMoments(c, count), m.mutable_moments());
  EncodeSums(SomeSums(c), m.mutable_sums());
  EncodeRunning(SomeRunning(c), m.mutable_running());
  return m;
}

// Each decodes (from a generated message or a parsed one) bitwise to `want`.
template <typename Wire>
void ExpectMoments(Wire wire, const bn::Moments& want) {
  absl::StatusOr<bn::Moments> got = DecodeMoments(std::move(wire));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->count, want.count);
  EXPECT_EQ(Bits(got->mean), Bits(want.mean));
  EXPECT_EQ(Bits(got->m2), Bits(want.m2));
}
template <typename Wire>
void ExpectSums(Wire wire, const bn::BackwardSums& want) {
  absl::StatusOr<bn::BackwardSums> got = DecodeSums(std::move(wire));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Bits(got->sum_dy), Bits(want.sum_dy));
  EXPECT_EQ(Bits(got->sum_dy_xhat), Bits(want.sum_dy_xhat));
}
template <typename Wire>
void ExpectRunning(Wire wire, const bn::RunningStats& want) {
  absl::StatusOr<bn::RunningStats> got = DecodeRunning(std::move(wire));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Bits(got->mean), Bits(want.mean));
  EXPECT_EQ(Bits(got->var), Bits(want.var));
}

// `w` holds what `t` holds: dtype, shape and the data's bytes.
void ExpectSame(const WireChannels& w, const Tensor& t) {
  EXPECT_EQ(w.dtype, t.dtype());
  EXPECT_EQ(w.shape, std::vector<int64_t>(t.shape().begin(), t.shape().end()));
  EXPECT_EQ(w.bytes, static_cast<int64_t>(t.data().size()));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(w.values.data()),
                        w.values.size() * sizeof(double)),
            t.data().size() % sizeof(double) == 0 ? t.data() : "");
}

// `bytes` read by ParseBn (in slices of `piece`) and by the generated class
// `M`: both accept them or both reject them, and read the same fields.
template <typename M>
void ExpectParsesAsGenerated(const std::string& bytes, BnStatsFields fields,
                             size_t piece = 7) {
  M want;
  const bool valid = want.ParseFromString(bytes);
  M head;
  BnStatsIn stats;
  const absl::Status s = ParseBn(Split(bytes, piece), fields, &head, &stats);
  ASSERT_EQ(s.ok(), valid) << s;
  if (!valid) {
    EXPECT_EQ(s.code(), kInvalid);
    return;
  }
  EXPECT_EQ(stats.moments.count, want.moments().count());
  ExpectSame(stats.moments.mean, want.moments().mean());
  ExpectSame(stats.moments.m2, want.moments().m2());
  ExpectSame(stats.sums.sum_dy, want.sums().sum_dy());
  ExpectSame(stats.sums.sum_dy_xhat, want.sums().sum_dy_xhat());
  ExpectSame(stats.running.mean, want.running().mean());
  ExpectSame(stats.running.var, want.running().var());
  want.clear_moments();
  want.clear_sums();
  want.clear_running();
  EXPECT_EQ(head.SerializeAsString(), want.SerializeAsString());
}

// The parsed statistics decode, or fail to, exactly as `want`'s do.
void ExpectSameDecodes(BnStatsIn stats, const BnRequest& want) {
  EXPECT_EQ(DecodeMoments(std::move(stats.moments)).status(),
            DecodeMoments(want.moments()).status());
  EXPECT_EQ(DecodeSums(std::move(stats.sums)).status(),
            DecodeSums(want.sums()).status());
  EXPECT_EQ(DecodeRunning(std::move(stats.running)).status(),
            DecodeRunning(want.running()).status());
}

// A BnRequest as ParseBn reads it from `bytes` in slices of `piece`.
struct Parsed {
  absl::Status status;
  BnRequest head;
  BnStatsIn stats;
};
Parsed Parse(const std::string& bytes, size_t piece = 7) {
  Parsed p;
  p.status = ParseBn(Split(bytes, piece), kBnRequestStats, &p.head, &p.stats);
  return p;
}

// Our framing, read by the generated class: every field, the doubles bitwise,
// a 10-byte id, multi-byte sizes (C = 1000) and a count over 127.
TEST(BnWireTest, FramedRequestReadsWithGeneratedClass) {
  const bn::Moments m = SomeMoments(1000, 300);
  const bn::BackwardSums s = SomeSums(1000);
  const bn::RunningStats r = SomeRunning(1000);
  BnRequest got;
  ASSERT_TRUE(got.ParseFromString(
      Flatten(WithId(0xfedcba9876543210u,
                     FrameBn(RequestHead(), kBnRequestStats, {&m, &s, &r})))));
  EXPECT_EQ(got.SerializeAsString(),
            FullRequest(1000, 300).SerializeAsString());
  EXPECT_EQ(got.id(), 0xfedcba9876543210u);
  EXPECT_EQ(got.job(), "job-7");
  EXPECT_EQ(got.worker(), 7);
  EXPECT_EQ(got.step(), int64_t{1} << 40);
  EXPECT_EQ(got.layer(), "block3/bn2");
  EXPECT_EQ(got.phase(), BN_FORWARD);
  EXPECT_TRUE(got.want_running());
  ExpectMoments(got.moments(), m);
  ExpectSums(got.sums(), s);
  ExpectRunning(got.running(), r);

  // A negative count (invalid, but it must travel) is a 10-byte varint.
  const bn::Moments negative = SomeMoments(3, -5);
  ASSERT_TRUE(got.ParseFromString(
      Flatten(WithId(1, FrameBn(BnRequest(), kBnRequestStats, {&negative})))));
  EXPECT_EQ(got.moments().count(), -5);
  EXPECT_FALSE(got.has_sums());
  EXPECT_FALSE(got.has_running());
}

TEST(BnWireTest, FramedResponseReadsWithGeneratedClass) {
  BnResponse head;
  head.set_code(9);
  head.set_message("step 3 is from the past");
  head.set_contributors(1000);
  const bn::Moments m = SomeMoments(200, 1 << 20);
  const bn::RunningStats r = SomeRunning(200);
  BnResponse got;
  ASSERT_TRUE(got.ParseFromString(Flatten(
      WithId(300, FrameBn(head, kBnResponseStats, {&m, nullptr, &r})))));
  EXPECT_EQ(got.id(), 300u);
  EXPECT_EQ(got.code(), 9);
  EXPECT_EQ(got.message(), "step 3 is from the past");
  EXPECT_EQ(got.contributors(), 1000);
  EXPECT_FALSE(got.has_sums());
  ExpectMoments(got.moments(), m);
  ExpectRunning(got.running(), r);
}

// Generated bytes, read by ParseBn across slice boundaries anywhere (pieces
// of 1 split every varint and double), decode to the values encoded.
TEST(BnWireTest, ParsesGeneratedMessagesAcrossSlices) {
  const std::string request = FullRequest(130, 1000).SerializeAsString();
  BnResponse response;
  response.set_id(1);
  response.set_contributors(3);
  EncodeSums(SomeSums(130), response.mutable_sums());
  for (size_t piece : {request.size(), size_t{7}, size_t{3}, size_t{1}}) {
    SCOPED_TRACE(piece);
    ExpectParsesAsGenerated<BnRequest>(request, kBnRequestStats, piece);
    ExpectParsesAsGenerated<BnResponse>(response.SerializeAsString(),
                                        kBnResponseStats, piece);
    Parsed p = Parse(request, piece);
    ASSERT_TRUE(p.status.ok()) << p.status;
    EXPECT_EQ(p.head.step(), int64_t{1} << 40);
    ExpectMoments(std::move(p.stats.moments), SomeMoments(130, 1000));
    ExpectSums(std::move(p.stats.sums), SomeSums(130));
    ExpectRunning(std::move(p.stats.running), SomeRunning(130));
    absl::StatusOr<uint64_t> id = PeekBnId(Split(request, piece));
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(*id, 0xfedcba9876543210u);
  }
}

// The last id wins, as protobuf reads it; none, or an explicit 0, is 0.
TEST(BnWireTest, PeekBnId) {
  const bn::Moments m = SomeMoments(3, 4);
  const grpc::Slice message = FrameBn(RequestHead(), kBnRequestStats, {&m});
  EXPECT_EQ(*PeekBnId(grpc::ByteBuffer(&message, 1)), 0u);
  EXPECT_EQ(*PeekBnId(WithId(0, message)), 0u);
  EXPECT_EQ(FrameBnId(~uint64_t{0}).size(), kMaxBnIdBytes);
  const std::string ids = Flatten(WithId(5, FrameBnId(9)));
  EXPECT_EQ(*PeekBnId(Split(ids + Flatten(WithId(0, message)), 1)), 0u);
  EXPECT_EQ(*PeekBnId(Split(ids + Flatten(grpc::ByteBuffer(&message, 1)), 1)),
            9u);
}

// An absent statistics message decodes as an empty generated one does.
TEST(BnWireTest, AbsentStatisticsDecodeAsEmptyMessages) {
  Parsed p = Parse(RequestHead().SerializeAsString());
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_EQ(p.head.SerializeAsString(), RequestHead().SerializeAsString());
  EXPECT_EQ(DecodeMoments(p.stats.moments).status().code(), kInvalid);
  EXPECT_EQ(DecodeMoments(p.stats.moments).status(),
            DecodeMoments(BnMoments()).status());
  ExpectSameDecodes(std::move(p.stats), BnRequest());
}

// Statistics before the head, head fields between them.
TEST(BnWireTest, FieldsInAnyOrder) {
  const BnRequest full = FullRequest(5, 9);
  BnRequest running, middle, moments, rest = full;
  *running.mutable_running() = full.running();
  middle.set_want_running(true);
  middle.set_layer(full.layer());
  *moments.mutable_moments() = full.moments();
  rest.clear_moments();
  rest.clear_running();
  const std::string bytes =
      running.SerializeAsString() + middle.SerializeAsString() +
      moments.SerializeAsString() + rest.SerializeAsString();
  ExpectParsesAsGenerated<BnRequest>(bytes, kBnRequestStats);
}

// Messages back to back merge: scalars take the last value, sub-messages
// merge field by field, a repeated shape appends.
TEST(BnWireTest, ConcatenatedMessagesMergeAsProtobufDoes) {
  const std::string full = FullRequest(4, 200).SerializeAsString();
  ExpectParsesAsGenerated<BnRequest>(full + full, kBnRequestStats);
  BnRequest later;
  later.set_step(3);
  later.set_job("other");
  later.mutable_moments()->set_count(7);
  EncodeSums(SomeSums(2), later.mutable_sums());
  const std::string bytes = full + later.SerializeAsString();
  ExpectParsesAsGenerated<BnRequest>(bytes, kBnRequestStats);
  Parsed p = Parse(bytes, 5);
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_EQ(p.head.step(), 3);
  EXPECT_EQ(p.head.job(), "other");
  EXPECT_EQ(p.head.layer(), "block3/bn2");
  bn::Moments want = SomeMoments(4, 200);
  want.count = 7;
  ExpectMoments(std::move(p.stats.moments), want);
  EXPECT_EQ(p.stats.sums.sum_dy.shape, (std::vector<int64_t>{4, 2}));
}

// Unknown fields, at the top and inside statistics and tensors, are skipped.
TEST(BnWireTest, SkipsUnknownFields) {
  const std::string varint100("\xa0\x06\x96\x01", 4);  // field 100: 150
  const std::string bytes101("\xaa\x06\x03xyz", 6);    // field 101: "xyz"
  // Field 102: fixed64.
  const std::string fixed102 = std::string("\xb1\x06") + "12345678";
  BnRequest m = FullRequest(3, 11);
  BnMoments* moments = m.mutable_moments();
  ASSERT_TRUE(moments->mutable_mean()->MergeFromString(bytes101));
  ASSERT_TRUE(moments->MergeFromString(varint100));
  const std::string bytes =
      varint100 + m.SerializeAsString() + bytes101 + fixed102;
  ExpectParsesAsGenerated<BnRequest>(bytes, kBnRequestStats);
  Parsed p = Parse(bytes, 3);
  ExpectMoments(std::move(p.stats.moments), SomeMoments(3, 11));
  EXPECT_EQ(*PeekBnId(Split(bytes, 3)), m.id());
}

// Tensor.shape is read packed (as protobuf writes it) or unpacked.
TEST(BnWireTest, PackedAndUnpackedShapes) {
  const bn::Moments m = SomeMoments(200, 5);
  BnRequest message;
  EncodeMoments(m, message.mutable_moments());
  Tensor* mean = message.mutable_moments()->mutable_mean();
  const std::string data = mean->data();
  // dtype 2, shape 200 unpacked (field 2, varint), then the data.
  ASSERT_TRUE(mean->ParseFromString(std::string("\x08\x02\x10\xc8\x01", 5)));
  mean->set_data(data);
  ExpectParsesAsGenerated<BnRequest>(message.SerializeAsString(),
                                     kBnRequestStats);
  Parsed p = Parse(message.SerializeAsString());
  ExpectMoments(std::move(p.stats.moments), m);
}

// Every prefix of a framed message either is a valid message (read as the
// generated class reads it) or is INVALID_ARGUMENT; none crashes.
TEST(BnWireTest, TruncatedMessages) {
  // Moments declared 5 bytes long that end after their 3-byte count: cut at a
  // field boundary inside the statistics, which protobuf rejects.
  const std::string cut("\x3a\x05\x08\x82\x01", 5);
  EXPECT_FALSE(BnRequest().ParseFromString(cut));
  EXPECT_EQ(PeekBnId(Split(cut, 7)).status().code(), kInvalid);
  EXPECT_EQ(Parse(cut).status.code(), kInvalid);

  const bn::Moments m = SomeMoments(3, 130);
  const bn::BackwardSums s = SomeSums(3);
  const bn::RunningStats r = SomeRunning(3);
  const std::string bytes = Flatten(
      WithId(77, FrameBn(RequestHead(), kBnRequestStats, {&m, &s, &r})));
  std::vector<size_t> parse_wrong, peek_wrong;  // prefix lengths
  for (size_t len = 0; len <= bytes.size(); ++len) {
    const std::string prefix = bytes.substr(0, len);
    const bool valid = BnRequest().ParseFromString(prefix);
    const absl::Status parsed = Parse(prefix, 4).status;
    const absl::Status peeked = PeekBnId(Split(prefix, 4)).status();
    if (parsed.ok() != valid || (!valid && parsed.code() != kInvalid)) {
      parse_wrong.push_back(len);
    }
    if (peeked.ok() != valid || (!valid && peeked.code() != kInvalid)) {
      peek_wrong.push_back(len);
    }
    if (valid) ExpectParsesAsGenerated<BnRequest>(prefix, kBnRequestStats);
  }
  EXPECT_EQ(parse_wrong, std::vector<size_t>());
  EXPECT_EQ(peek_wrong, std::vector<size_t>());
  EXPECT_TRUE(Parse(bytes, 4).status.ok());
}

// Statistics under a wire type other than length-delimited, and bytes that
// are no message at all (an overlong varint, tag 0, wire type 7, a length past
// the end, an unterminated group), are INVALID_ARGUMENT.
TEST(BnWireTest, RejectsMalformedBytes) {
  const std::string head = RequestHead().SerializeAsString();
  EXPECT_EQ(Parse(head + "\x38\x05", 3).status.code(), kInvalid);  // 7: varint
  EXPECT_EQ(Parse(head + "\x45\x01\x02\x03\x04", 3).status.code(),
            kInvalid);  // 8: fixed32
  for (const std::string& garbage :
       {std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
        std::string("\x00", 1), std::string("\x0f\x01", 2),
        std::string("\x3a\x7f\x00", 3), std::string("\x0b\x08\x01", 3)}) {
    EXPECT_EQ(Parse(head + garbage, 3).status.code(), kInvalid);
    EXPECT_EQ(PeekBnId(Split(head + garbage, 3)).status().code(), kInvalid);
  }
}

// A bad tensor parses and then fails to decode exactly as it does through
// the generated class: data not a multiple of 8 bytes, the wrong dtype, NaN.
TEST(BnWireTest, BadTensorsFailAsOnTheGeneratedPath) {
  const auto both = [](const BnRequest& message) {
    Parsed p = Parse(message.SerializeAsString());
    EXPECT_TRUE(p.status.ok()) << p.status;
    const absl::Status ours =
        DecodeMoments(std::move(p.stats.moments)).status();
    EXPECT_EQ(ours, DecodeMoments(message.moments()).status());
    return ours;
  };
  BnRequest message = FullRequest(1, 12);
  message.mutable_moments()->mutable_mean()->set_data(std::string(12, '\x01'));
  absl::Status s = both(message);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_NE(s.message().find("got 12"), std::string::npos) << s;

  message = FullRequest(2, 12);
  message.mutable_moments()->mutable_m2()->set_dtype(DTYPE_FLOAT32);
  s = both(message);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_NE(s.message().find("DTYPE_FLOAT32"), std::string::npos) << s;

  bn::Moments nan = SomeMoments(2, 12);
  nan.mean[1] = std::numeric_limits<double>::quiet_NaN();
  EncodeMoments(nan, message.mutable_moments());
  EXPECT_EQ(both(message).code(), kInvalid);
}

// C = 0 frames and parses; it fails to decode as it does on the generated
// path.
TEST(BnWireTest, EmptyStatistics) {
  const bn::Moments m;
  const bn::BackwardSums s;
  const bn::RunningStats r;
  const std::string bytes =
      Flatten(WithId(2, FrameBn(RequestHead(), kBnRequestStats, {&m, &s, &r})));
  BnRequest generated;
  ASSERT_TRUE(generated.ParseFromString(bytes));
  EXPECT_EQ(generated.moments().mean().shape_size(), 1);
  ExpectParsesAsGenerated<BnRequest>(bytes, kBnRequestStats, 3);
  Parsed p = Parse(bytes, 3);
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_EQ(DecodeMoments(p.stats.moments).status().code(), kInvalid);
  EXPECT_EQ(DecodeSums(p.stats.sums).status().code(), kInvalid);
  EXPECT_EQ(DecodeRunning(p.stats.running).status().code(), kInvalid);
  ExpectSameDecodes(std::move(p.stats), generated);
}

}  // namespace
}  // namespace bnps::proto
