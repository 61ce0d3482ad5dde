// TensorReader against protobuf's parser: whatever bytes the reader accepts,
// protobuf's generated classes accept and read the same way.

#include <cstdint>
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
#include "proto/tensor_wire.h"
#include "proto/tensor_wire_testing.h"
#include "proto/wire_testing.h"

namespace bnps::proto {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

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
