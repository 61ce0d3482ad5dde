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
#include "proto/wire_testing.h"

namespace bnps::proto {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

std::vector<float> Ramp(int n, float scale = 0.5f) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = i * scale - 3;
  return v;
}

// Collects tensors as a TensorReader receives them.
struct Received {
  std::map<std::string, std::vector<float>> tensors;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::vector<std::string> completed;

  TensorReader Reader() {
    return TensorReader(
        [this](const std::string& key, absl::Span<const int64_t> shape,
               int64_t n) -> absl::StatusOr<float*> {
          shapes[key].assign(shape.begin(), shape.end());
          std::vector<float>& v = tensors[key];
          v.assign(n, NAN);
          return v.data();
        },
        [this](const std::string& key) {
          completed.push_back(key);
          return absl::OkStatus();
        });
  }
};

PushGradientsRequest Head() {
  PushGradientsRequest head;
  head.set_job("j");
  head.set_worker(3);
  head.set_step(17);
  head.set_num_samples(64);
  return head;
}

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

// --- The reader against protobuf's parser
//
// Whatever bytes TensorReader accepts, protobuf's generated classes must
// accept and read the same way, and what they refuse the reader refuses
// before any callback runs.

// Protobuf's wire format written by hand.
std::string Varint(uint64_t v) {
  std::string s;
  for (; v >= 0x80; v >>= 7) s += static_cast<char>(v | 0x80);
  s += static_cast<char>(v);
  return s;
}
// `v` as a varint of exactly `bytes` bytes (overlong if it needs fewer).
std::string VarintOf(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i, v >>= 7) {
    s += static_cast<char>((v & 0x7f) | (i + 1 < bytes ? 0x80 : 0));
  }
  return s;
}
std::string Tag(int field, int wire_type) {
  return Varint(static_cast<uint64_t>(field) << 3 | wire_type);
}
std::string Len(int field, const std::string& body) {
  return Tag(field, 2) + Varint(body.size()) + body;
}
std::string VarintField(int field, uint64_t v) { return Tag(field, 0) + Varint(v); }
std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
// A 1-D float32 part of `values`.
std::string Part(const std::vector<float>& values) {
  return Tag(1, 0) + Varint(DTYPE_FLOAT32) + Len(2, Varint(values.size())) +
         Len(3, Floats(values));
}
// A whole tensor "w" of shape [2] in one chunk; `extra` goes at the end of
// the chunk.
std::string WholeChunk(const std::string& extra = "") {
  return Len(1, "w") + Len(2, Varint(2)) + Len(4, Part({1.5f, -2.0f})) + extra;
}
// A PushGradientsRequest: Head() and then `rest` (chunks, field 5).
std::string PushOf(const std::string& rest) {
  return Head().SerializeAsString() + rest;
}

// What a TensorReader made of one message.
struct Outcome {
  absl::Status status;
  std::map<std::string, std::vector<float>> tensors;  // completed ones
  std::vector<std::string> completed;
  std::string head;  // serialized
  int callbacks = 0;  // destinations asked for
};

template <typename Message>
Outcome ReadOne(const std::string& bytes, int chunks_field) {
  Outcome out;
  Received r;
  TensorReader reader(
      [&](const std::string& key, absl::Span<const int64_t> shape,
          int64_t n) -> absl::StatusOr<float*> {
        ++out.callbacks;
        std::vector<float>& v = r.tensors[key];
        v.assign(n, NAN);
        return v.data();
      },
      [&](const std::string& key) {
        r.completed.push_back(key);
        return absl::OkStatus();
      });
  Message head;
  out.status = reader.Read(Split(bytes, 7), chunks_field, &head);
  out.completed = r.completed;
  for (const std::string& key : r.completed) out.tensors[key] = r.tensors[key];
  out.head = head.SerializeAsString();
  return out;
}

// The reader's verdict on `bytes` is protobuf's: if protobuf refuses them,
// the reader refuses them as malformed without asking for a destination;
// if protobuf parses them, the reader makes of them exactly what it makes of
// protobuf's own serialization of what it parsed. Returns whether protobuf
// parsed them.
template <typename Message>
bool ExpectProtobufVerdict(const std::string& bytes, int chunks_field,
                           const std::string& what) {
  google::protobuf::LogSilencer quiet;  // protobuf logs invalid UTF-8
  Message parsed;
  const bool parses = parsed.ParseFromString(bytes);
  const Outcome got = ReadOne<Message>(bytes, chunks_field);
  if (!parses) {
    EXPECT_FALSE(got.status.ok()) << what << ": protobuf refuses it";
    EXPECT_NE(got.status.message().find("malformed message"),
              absl::string_view::npos)
        << what << ": " << got.status;
    EXPECT_EQ(got.callbacks, 0) << what;
    return false;
  }
  const Outcome want =
      ReadOne<Message>(parsed.SerializeAsString(), chunks_field);
  EXPECT_EQ(got.status, want.status) << what;
  EXPECT_EQ(got.completed, want.completed) << what;
  EXPECT_EQ(got.tensors, want.tensors) << what;
  EXPECT_EQ(got.head, want.head) << what;
  return true;
}

TEST(TensorWireTest, AcceptsExactlyWhatProtobufAccepts) {
  const std::string chunk = WholeChunk();
  // Top-level field 99, varint: 3 bytes that a length running past the end of
  // its chunk swallows.
  const std::string after = VarintField(99, 1);
  ASSERT_EQ(after.size(), 3u);
  auto nested_groups = [](int depth) {
    std::string s;
    for (int i = 0; i < depth; ++i) s += Tag(9, 3);
    for (int i = 0; i < depth; ++i) s += Tag(9, 4);
    return s;
  };
  struct Case {
    std::string what;
    std::string bytes;
    bool protobuf_parses;
  };
  const std::vector<Case> cases = {
      {"a valid message", PushOf(Len(5, chunk)), true},
      {"an empty message", "", true},
      {"the part's length runs past the end of its chunk",
       PushOf(Tag(5, 2) +
              Varint(chunk.size()) +
              Len(1, "w") + Len(2, Varint(2)) + Tag(4, 2) +
              Varint(Part({1.5f, -2.0f}).size() + 3) + Part({1.5f, -2.0f}) +
              after),
       false},
      {"the packed shape runs past the end of its chunk",
       [&] {
         const std::string body =
             Len(1, "w") + Len(4, Part({1.5f, -2.0f})) + Tag(2, 2) +
             Varint(4) + Varint(2);
         return PushOf(Tag(5, 2) + Varint(body.size()) + body + after);
       }(),
       false},
      {"the key runs past the end of its chunk",
       [&] {
         const std::string body =
             Len(2, Varint(2)) + Len(4, Part({1.5f, -2.0f})) + Tag(1, 2) +
             Varint(4) + "w";
         return PushOf(Tag(5, 2) + Varint(body.size()) + body + after);
       }(),
       false},
      {"the chunk runs past the end of the message",
       PushOf(Tag(5, 2) + Varint(chunk.size() + 1) + chunk), false},
      {"a truncated varint at the end of a chunk",
       PushOf(Len(5, chunk + Tag(3, 0) + "\x80")), false},
      {"a varint of 10 bytes", PushOf(Len(5, chunk + Tag(3, 0) + VarintOf(0, 10))),
       true},
      {"a varint of 10 bytes with bits past 64",
       PushOf(Len(5, chunk + Tag(3, 0) + std::string(9, '\xff') + "\x7f")),
       true},
      {"a varint of 11 bytes",
       PushOf(Len(5, chunk + Tag(3, 0) + VarintOf(0, 11))), false},
      {"a tag of 5 bytes",
       PushOf(Len(5, VarintOf(1 << 3 | 2, 5) + Varint(1) + "w" +
                         Len(2, Varint(2)) + Len(4, Part({1.5f, -2.0f})))),
       true},
      {"a tag of 6 bytes",
       PushOf(Len(5, VarintOf(1 << 3 | 2, 6) + Varint(1) + "w" +
                         Len(2, Varint(2)) + Len(4, Part({1.5f, -2.0f})))),
       false},
      {"a length of 5 bytes",
       PushOf(Len(5, Tag(1, 2) + VarintOf(1, 5) + "w" + Len(2, Varint(2)) +
                         Len(4, Part({1.5f, -2.0f})))),
       true},
      {"a length of 6 bytes",
       PushOf(Len(5, Tag(1, 2) + VarintOf(1, 6) + "w" + Len(2, Varint(2)) +
                         Len(4, Part({1.5f, -2.0f})))),
       false},
      {"a length of 2^31", PushOf(Len(5, chunk + Tag(8, 2) + Varint(1u << 31))),
       false},
      {"a length-delimited field number 0", PushOf(Len(5, chunk + Len(0, "x"))),
       false},
      {"a varint field number 0", PushOf(Len(5, chunk + Tag(0, 0) + "\x01")),
       false},
      {"tag 0 at the top level", PushOf(Len(5, chunk)) + std::string(1, '\0'),
       false},
      {"wire type 6", PushOf(Len(5, chunk + Tag(8, 6) + "\x01")), false},
      {"wire type 7", PushOf(Len(5, chunk + Tag(8, 7) + "\x01")), false},
      {"an END_GROUP with no group", PushOf(Len(5, chunk + Tag(9, 4))), false},
      {"an unknown group", PushOf(Len(5, chunk + Tag(9, 3) + VarintField(1, 5) +
                                         Tag(9, 4))),
       true},
      {"a group closed by another field's END_GROUP",
       PushOf(Len(5, chunk + Tag(9, 3) + Tag(8, 4))), false},
      {"a group left open at the end of its chunk",
       PushOf(Len(5, chunk + Tag(9, 3) + VarintField(1, 5))), false},
      {"a key that is not UTF-8",
       PushOf(Len(5, Len(1, "w\xff") + Len(2, Varint(2)) +
                         Len(4, Part({1.5f, -2.0f})))),
       false},
      {"a job that is not UTF-8", Len(1, "j\xc3") + Len(5, chunk), false},
      {"a key after the payload (the last key counts)",
       PushOf(Len(5, Len(1, "v") + Len(2, Varint(2)) +
                         Len(4, Part({1.5f, -2.0f})) + Len(1, "w"))),
       true},
      {"two parts, merged",
       PushOf(Len(5, Len(1, "w") + Len(2, Varint(2)) +
                         Len(4, Tag(1, 0) + Varint(DTYPE_FLOAT32) +
                                    Len(2, Varint(2))) +
                         Len(4, Len(3, Floats({1.5f, -2.0f}))))),
       true},
      {"data twice (the last counts)",
       PushOf(Len(5, Len(1, "w") + Len(2, Varint(2)) +
                         Len(4, Len(3, Floats({NAN, NAN})) + Part({1.5f, -2.0f})))),
       true},
      {"a key sent as a varint as well",
       PushOf(Len(5, chunk + VarintField(1, 5))), true},
      {"a key sent only as a varint",
       PushOf(Len(5, VarintField(1, 5) + Len(2, Varint(2)) +
                         Len(4, Part({1.5f, -2.0f})))),
       true},
      {"an offset sent length-delimited", PushOf(Len(5, chunk + Len(3, "xy"))),
       true},
      {"a part sent as a varint",
       PushOf(Len(5, Len(1, "w") + Len(2, Varint(2)) + VarintField(4, 1))),
       true},
      {"a shape sent as fixed32",
       PushOf(Len(5, chunk + Tag(2, 5) + std::string(4, '\x01'))), true},
      {"chunks sent as a varint", PushOf(VarintField(5, 3)), true},
      {"a head field after the chunks", Len(5, chunk) + Head().SerializeAsString(),
       true},
      {"a packed shape whose last varint runs past it",
       PushOf(Len(5, Len(1, "w") + Tag(2, 2) + Varint(1) + "\x82\x01" +
                         Len(4, Part({1.5f, -2.0f})))),
       false},
      {"groups 98 deep in a part (100 with the chunk and the part)",
       PushOf(Len(5, Len(1, "w") + Len(2, Varint(2)) +
                         Len(4, Part({1.5f, -2.0f}) + nested_groups(98)))),
       true},
      {"groups 99 deep in a part (101 with the chunk and the part)",
       PushOf(Len(5, Len(1, "w") + Len(2, Varint(2)) +
                         Len(4, Part({1.5f, -2.0f}) + nested_groups(99)))),
       false},
      {"groups 100 deep at the top level", PushOf(nested_groups(100)), true},
      {"groups 101 deep at the top level", PushOf(nested_groups(101)), false},
  };
  for (const Case& c : cases) {
    PushGradientsRequest parsed;
    {
      google::protobuf::LogSilencer quiet;
      EXPECT_EQ(parsed.ParseFromString(c.bytes), c.protobuf_parses)
          << c.what << ": the table is wrong about protobuf";
    }
    ExpectProtobufVerdict<PushGradientsRequest>(c.bytes, 5, c.what);
  }
  // The reported one: the part's length ran past its chunk and the tensor was
  // applied. Now nothing reaches the destination.
  const Outcome o = ReadOne<PushGradientsRequest>(cases[2].bytes, 5);
  EXPECT_EQ(o.status.code(), kInvalid);
  EXPECT_EQ(o.callbacks, 0);
  // Merged parts and the last data field give the tensor protobuf reads.
  for (const char* what : {"two parts, merged", "data twice (the last counts)",
                           "a key after the payload (the last key counts)"}) {
    for (const Case& c : cases) {
      if (c.what != what) continue;
      const Outcome merged = ReadOne<PushGradientsRequest>(c.bytes, 5);
      ASSERT_TRUE(merged.status.ok()) << what << ": " << merged.status;
      EXPECT_EQ(merged.tensors.at("w"), (std::vector<float>{1.5f, -2.0f}))
          << what;
    }
  }
}

// Random mutations of valid messages (a fixed seed, a bounded count): the
// reader's verdict is protobuf's on every one.
TEST(TensorWireTest, MutatedMessagesGetProtobufsVerdict) {
  std::vector<std::pair<std::string, int>> seeds;  // bytes, chunks field
  {
    PushGradientsRequest m = Head();
    const int64_t a_shape[] = {3, 4}, b_shape[] = {5};
    AppendChunks("layer1/w", a_shape, Ramp(12), 5, m.mutable_chunks());
    AppendChunks("b", b_shape, Ramp(5, 2.0f), 5, m.mutable_chunks());
    seeds.emplace_back(m.SerializeAsString(), 5);
    PullParametersResponse p;
    p.set_version(41);
    AppendChunks("w", b_shape, Ramp(5), 2, p.mutable_chunks());
    seeds.emplace_back(p.SerializeAsString(), 1);
    // The builder's own order: head first, chunk fields before the payload.
    ChunkedMessageBuilder builder(Head(), 5, 1 << 20);
    builder.AddChunk("k", b_shape, 0, Ramp(5), nullptr);
    seeds.emplace_back(Flatten(builder.Build()), 5);
  }
  std::mt19937 rng(20);
  int parsed = 0, refused = 0;
  constexpr int kMutationsPerSeed = 1500;
  for (const auto& [seed, chunks_field] : seeds) {
    for (int i = 0; i < kMutationsPerSeed; ++i) {
      std::string b = seed;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits && !b.empty(); ++e) {
        const size_t at = rng() % b.size();
        switch (rng() % 7) {
          case 0: b[at] = static_cast<char>(rng()); break;
          case 1: b[at] = static_cast<char>(b[at] ^ (1 << (rng() % 8))); break;
          case 2: b.insert(at, 1, static_cast<char>(rng())); break;
          case 3: b.erase(at, 1); break;
          case 4: b.resize(at); break;
          case 5: b[at] = "\x00\x7f\x80\xff"[rng() % 4]; break;
          case 6: b.insert(at, b.substr(rng() % b.size(), 1 + rng() % 6)); break;
        }
      }
      const std::string what = absl::StrCat("mutation ", i, " of a seed");
      const bool ok =
          chunks_field == 5
              ? ExpectProtobufVerdict<PushGradientsRequest>(b, 5, what)
              : ExpectProtobufVerdict<PullParametersResponse>(b, 1, what);
      (ok ? parsed : refused) += 1;
      if (::testing::Test::HasFailure()) return;  // one report is enough
    }
  }
  // Both kinds were exercised.
  EXPECT_GT(parsed, 300);
  EXPECT_GT(refused, 300);
}

}  // namespace
}  // namespace bnps::proto
