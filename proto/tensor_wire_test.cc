#include "proto/tensor_wire.h"

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "proto/bnps.pb.h"
#include "proto/codec.h"
#include "proto/limits.h"
#include "proto/tensor_wire_testing.h"
#include "proto/wire_testing.h"

namespace bnps::proto {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

TEST(TensorWireTest, BuilderWritesWhatProtobufReads) {
  const std::vector<float> a = Ramp(1000), b = Ramp(7, 2.0f);
  const int64_t a_shape[] = {10, 100}, b_shape[] = {7};
  PushGradientsRequest want = Head();
  AppendChunks("a", a_shape, a, 300, want.mutable_chunks());
  AppendChunks("b", b_shape, b, 300, want.mutable_chunks());

  ChunkedMessageBuilder builder(Head(), 5, 1 << 20);
  auto owner = std::make_shared<std::vector<float>>(b);
  std::weak_ptr<std::vector<float>> watch = owner;
  for (int64_t at = 0; at < 1000; at += 300) {
    builder.AddChunk("a", a_shape, at,
                     absl::MakeConstSpan(a).subspan(at, 300), nullptr);
  }
  builder.AddChunk("b", b_shape, 0, *owner, owner);
  owner.reset();
  EXPECT_EQ(builder.num_chunks(), 5);
  {
    grpc::ByteBuffer message = builder.Build();
    EXPECT_EQ(static_cast<int64_t>(message.Length()),
              static_cast<int64_t>(want.ByteSizeLong()));
    PushGradientsRequest got;
    ASSERT_TRUE(got.ParseFromString(Flatten(message)));
    EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
    EXPECT_FALSE(watch.expired());  // the message still references b
  }
  EXPECT_TRUE(watch.expired());
  // The builder starts over with the same head.
  EXPECT_EQ(builder.num_chunks(), 0);
  PushGradientsRequest empty;
  ASSERT_TRUE(empty.ParseFromString(Flatten(builder.Build())));
  EXPECT_EQ(empty.SerializeAsString(), Head().SerializeAsString());
}

TEST(TensorWireTest, ReaderReassemblesProtobufMessagesAcrossSlices) {
  const std::vector<float> a = Ramp(1000), b = Ramp(7, 2.0f);
  const int64_t a_shape[] = {10, 100}, b_shape[] = {7};
  PushGradientsRequest message = Head();
  AppendChunks("a", a_shape, a, 300, message.mutable_chunks());
  AppendChunks("b", b_shape, b, 3, message.mutable_chunks());
  const std::string bytes = message.SerializeAsString();
  for (size_t piece : {bytes.size(), size_t{4096}, size_t{7}, size_t{1}}) {
    Received r;
    TensorReader reader = r.Reader();
    PushGradientsRequest head;
    ASSERT_TRUE(reader.Read(Split(bytes, piece), 5, &head).ok()) << piece;
    EXPECT_FALSE(reader.pending());
    EXPECT_EQ(r.tensors["a"], a);
    EXPECT_EQ(r.tensors["b"], b);
    EXPECT_EQ(r.shapes["a"], (std::vector<int64_t>{10, 100}));
    EXPECT_EQ(r.completed, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(head.SerializeAsString(), Head().SerializeAsString());
  }
}

TEST(TensorWireTest, TensorSpansMessages) {
  const std::vector<float> a = Ramp(10);
  const int64_t shape[] = {10};
  google::protobuf::RepeatedPtrField<TensorChunk> chunks;
  AppendChunks("a", shape, a, 4, &chunks);
  ASSERT_EQ(chunks.size(), 3);
  Received r;
  TensorReader reader = r.Reader();
  for (int i = 0; i < 3; ++i) {
    PullParametersResponse m;
    *m.add_chunks() = chunks[i];
    m.set_version(5);
    PullParametersResponse head;
    ASSERT_TRUE(
        reader.Read(Split(m.SerializeAsString(), 64), 1, &head).ok());
    EXPECT_EQ(head.version(), 5);
    EXPECT_EQ(head.chunks_size(), 0);
    EXPECT_EQ(reader.pending(), i < 2);
  }
  EXPECT_EQ(r.tensors["a"], a);
}

TEST(TensorWireTest, BuilderAndReaderRoundTrip) {
  const std::vector<float> a = Ramp(5000);
  const int64_t shape[] = {50, 100};
  PullParametersResponse head;
  head.set_version(9);
  ChunkedMessageBuilder builder(head, 1, 1 << 20);
  auto owner = std::make_shared<std::vector<float>>(a);
  for (int64_t at = 0; at < 5000; at += 1024) {
    builder.AddChunk("w", shape, at,
                     absl::MakeConstSpan(*owner).subspan(at, 1024), owner);
  }
  const std::string bytes = Flatten(builder.Build());
  Received r;
  TensorReader reader = r.Reader();
  PullParametersResponse got;
  ASSERT_TRUE(reader.Read(Split(bytes, 333), 1, &got).ok());
  EXPECT_EQ(got.version(), 9);
  EXPECT_EQ(r.tensors["w"], a);
}

// Tensors cut into kChunkFloats chunks and packed into messages of at most
// max_bytes; reading the messages in order gives the tensors back.
TEST(TensorWireTest, AddTensorCutsAndPacks) {
  const int64_t big = kChunkFloats * 2 + 5;  // three chunks
  const std::vector<float> a = Ramp(big, 1e-3f), b = Ramp(3), e;
  const int64_t a_shape[] = {big}, b_shape[] = {3}, e_shape[] = {0, 4};
  const int64_t max_bytes = kChunkBytes + 4096;  // one full chunk a message
  ChunkedMessageBuilder builder(Head(), 5, max_bytes);
  std::vector<grpc::ByteBuffer> messages;
  const auto keep = [&](grpc::ByteBuffer m) {
    messages.push_back(std::move(m));
    return true;
  };
  ASSERT_TRUE(builder.AddTensor("a", a_shape, a, nullptr, keep));
  auto owner = std::make_shared<std::vector<float>>(b);
  ASSERT_TRUE(builder.AddTensor("b", b_shape, *owner, owner, keep));
  ASSERT_TRUE(builder.AddTensor("e", e_shape, e, nullptr, keep));
  messages.push_back(builder.Build());
  ASSERT_EQ(messages.size(), 2u);  // a0 | a1 a2 b e
  Received r;
  TensorReader reader = r.Reader();
  for (const grpc::ByteBuffer& m : messages) {
    EXPECT_LE(static_cast<int64_t>(m.Length()), max_bytes);
    PushGradientsRequest head;
    ASSERT_TRUE(reader.Read(m, 5, &head).ok());
    EXPECT_EQ(head.step(), 17);
  }
  EXPECT_EQ(r.tensors["a"], a);
  EXPECT_EQ(r.tensors["b"], b);
  EXPECT_EQ(r.completed, (std::vector<std::string>{"a", "b", "e"}));
  EXPECT_EQ(r.shapes["e"], (std::vector<int64_t>{0, 4}));

  // A flush that fails stops the tensor.
  ChunkedMessageBuilder refused(Head(), 5, max_bytes);
  int flushes = 0;
  EXPECT_FALSE(refused.AddTensor("a", a_shape, a, nullptr,
                                 [&](grpc::ByteBuffer) {
                                   ++flushes;
                                   return false;
                                 }));
  EXPECT_EQ(flushes, 1);
  EXPECT_EQ(refused.num_chunks(), 0);
}

TEST(TensorWireTest, EmptyTensorAndUnknownFields) {
  const int64_t shape[] = {0};
  PushGradientsRequest message = Head();
  AppendChunks("e", shape, {}, 4, message.mutable_chunks());
  std::string bytes = message.SerializeAsString();
  // Field 99 (varint) is unknown to every message here.
  bytes += std::string("\x98\x06\x01", 3);
  Received r;
  TensorReader reader = r.Reader();
  PushGradientsRequest head;
  ASSERT_TRUE(reader.Read(Split(bytes, 5), 5, &head).ok());
  EXPECT_EQ(r.completed, (std::vector<std::string>{"e"}));
  EXPECT_TRUE(r.tensors["e"].empty());
  EXPECT_EQ(head.step(), 17);
}

// Reads `chunks` as one message; the first error, or OK.
absl::Status ReadChunks(
    const google::protobuf::RepeatedPtrField<TensorChunk>& chunks) {
  PushGradientsRequest m = Head();
  *m.mutable_chunks() = chunks;
  Received r;
  TensorReader reader = r.Reader();
  PushGradientsRequest head;
  return reader.Read(Split(m.SerializeAsString(), 100), 5, &head);
}

TEST(TensorWireTest, RejectsBadChunks) {
  const std::vector<float> v(10, 1.0f);
  const int64_t shape[] = {10};
  google::protobuf::RepeatedPtrField<TensorChunk> chunks;
  AppendChunks("w", shape, v, 4, &chunks);
  ASSERT_TRUE(ReadChunks(chunks).ok());

  auto with = [&](auto change) {
    google::protobuf::RepeatedPtrField<TensorChunk> c = chunks;
    change(c);
    return ReadChunks(c).code();
  };
  EXPECT_EQ(with([](auto& c) { c.SwapElements(1, 2); }), kInvalid);  // gap
  EXPECT_EQ(with([](auto& c) { c[1].set_key("v"); }), kInvalid);  // interleaved
  EXPECT_EQ(with([](auto& c) { c[0].clear_key(); }), kInvalid);
  EXPECT_EQ(with([](auto& c) { c[0].set_key(std::string(300, 'k')); }),
            kInvalid);
  EXPECT_EQ(with([](auto& c) { c[0].set_shape(0, -1); }), kInvalid);
  EXPECT_EQ(with([](auto& c) { c[1].add_shape(1); }), kInvalid);  // new shape
  EXPECT_EQ(with([](auto& c) {
              const int64_t big[] = {20};
              EncodeFloat32(std::vector<float>(20, 1.0f), big,
                            c[0].mutable_part());
            }),
            kInvalid);  // past the end
  EXPECT_EQ(with([](auto& c) {
              c[0].mutable_part()->set_dtype(DTYPE_FLOAT64);
            }),
            kInvalid);
  EXPECT_EQ(with([](auto& c) { c[0].mutable_part()->add_shape(1); }),
            kInvalid);  // not 1-D
  EXPECT_EQ(with([](auto& c) {
              c[0].mutable_part()->mutable_data()->resize(15);
            }),
            kInvalid);  // bytes do not match the declared length
  EXPECT_EQ(with([](auto& c) {
              const float inf = INFINITY;
              c[2].mutable_part()->mutable_data()->replace(4, 4,
                  reinterpret_cast<const char*>(&inf), 4);
            }),
            kInvalid);
  EXPECT_EQ(with([](auto& c) { c[0].clear_part(); }), kInvalid);
}

// A payload is read and checked in blocks of a few thousand floats; a NaN or
// infinity anywhere (a block's first or last element, a later chunk, the
// tensor's last element) is named by its index in the whole tensor.
TEST(TensorWireTest, NamesTheFirstNonFiniteElementWhereverItIs) {
  constexpr int kN = 30000;
  const int64_t shape[] = {kN};
  for (int at : {0, 4095, 4096, 8191, 12345, 19999, 20000, 29999}) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> v = Ramp(kN, 1e-3f);
      v[at] = bad;
      if (at + 7 < kN) v[at + 7] = NAN;  // a later one is not reported
      google::protobuf::RepeatedPtrField<TensorChunk> chunks;
      AppendChunks("w", shape, v, 10000, &chunks);
      ASSERT_EQ(chunks.size(), 3);
      const absl::Status s = ReadChunks(chunks);
      EXPECT_EQ(s.code(), kInvalid) << at;
      EXPECT_NE(s.message().find(absl::StrCat("element ", at, " is not")),
                absl::string_view::npos)
          << at << ": " << s;
    }
  }
}

TEST(TensorWireTest, RejectsMalformedBytes) {
  PushGradientsRequest m = Head();
  const int64_t shape[] = {10};
  AppendChunks("w", shape, std::vector<float>(10, 1.0f), 10,
               m.mutable_chunks());
  const std::string bytes = m.SerializeAsString();
  auto read = [](const std::string& b) {
    Received r;
    TensorReader reader = r.Reader();
    PushGradientsRequest head;
    return reader.Read(Split(b, 16), 5, &head).code();
  };
  ASSERT_EQ(read(bytes), absl::StatusCode::kOk);
  EXPECT_EQ(read(bytes.substr(0, bytes.size() - 3)), kInvalid);  // truncated
  EXPECT_EQ(read(bytes + std::string(1, '\0')), kInvalid);  // tag 0
}

TEST(TensorWireTest, CallbackErrorsEndTheRead) {
  PushGradientsRequest m = Head();
  const int64_t shape[] = {4};
  AppendChunks("w", shape, Ramp(4), 2, m.mutable_chunks());
  grpc::ByteBuffer message = Split(m.SerializeAsString(), 1000);
  std::vector<float> room(4);
  PushGradientsRequest head;

  TensorReader refuses(
      [](const std::string& key, absl::Span<const int64_t>, int64_t)
          -> absl::StatusOr<float*> {
        return absl::NotFoundError("no parameter " + key);
      },
      [](const std::string&) { return absl::OkStatus(); });
  EXPECT_EQ(refuses.Read(message, 5, &head).code(),
            absl::StatusCode::kNotFound);

  int completed = 0;
  TensorReader fails_at_end(
      [&](const std::string&, absl::Span<const int64_t>, int64_t n)
          -> absl::StatusOr<float*> {
        EXPECT_EQ(n, 4);
        return room.data();
      },
      [&](const std::string&) {
        ++completed;
        return absl::FailedPreconditionError("step from the past");
      });
  EXPECT_EQ(fails_at_end.Read(message, 5, &head).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(completed, 1);
  EXPECT_EQ(room, Ramp(4));
}

// The head is parsed from the whole message (wherever its fields are) and
// checked before any chunk reaches the callbacks.
TEST(TensorWireTest, HeadIsCheckedBeforeAnyChunk) {
  PushGradientsRequest chunks_only;
  const int64_t shape[] = {4};
  AppendChunks("w", shape, Ramp(4), 2, chunks_only.mutable_chunks());
  // Protobuf's order for a peer that writes the chunks first.
  const std::string bytes =
      chunks_only.SerializeAsString() + Head().SerializeAsString();
  for (bool refuse : {false, true}) {
    int destinations = 0;
    TensorReader reader(
        [&](const std::string&, absl::Span<const int64_t>, int64_t n)
            -> absl::StatusOr<float*> {
          ++destinations;
          static std::vector<float> room;
          room.assign(n, 0);
          return room.data();
        },
        [](const std::string&) { return absl::OkStatus(); });
    PushGradientsRequest head;
    const absl::Status s = reader.Read(Split(bytes, 5), 5, &head, [&] {
      EXPECT_EQ(destinations, 0);
      EXPECT_EQ(head.step(), 17);
      return refuse ? absl::PermissionDeniedError("no") : absl::OkStatus();
    });
    EXPECT_EQ(s.code(), refuse ? absl::StatusCode::kPermissionDenied
                               : absl::StatusCode::kOk);
    EXPECT_EQ(destinations, refuse ? 0 : 1);
  }
}

}  // namespace
}  // namespace bnps::proto
