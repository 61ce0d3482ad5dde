#include "proto/tensor_wire.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "util/finite.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpc/slice.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "proto/bnps.pb.h"
#include "proto/codec.h"
#include "proto/limits.h"
#include "proto/wire_fields.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "bnps sends tensors as little-endian bytes with memcpy");

namespace bnps::proto {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;
using wire::AppendLengthPrefix;
using wire::Malformed;

// Payloads are copied and checked for NaN and infinity this many floats
// (16 KB) at a time.
constexpr int64_t kCheckBlockFloats = 4096;

// Field numbers of TensorChunk and Tensor (proto/bnps.proto).
constexpr int kChunkKey = 1;
constexpr int kChunkShape = 2;
constexpr int kChunkOffset = 3;
constexpr int kChunkPart = 4;
constexpr int kTensorDtype = 1;
constexpr int kTensorShape = 2;
constexpr int kTensorData = 3;

// Releases the owner of a shared payload when gRPC drops the slice.
void ReleaseOwner(void* owner) {
  delete static_cast<std::shared_ptr<const void>*>(owner);
}

}  // namespace

// --- ChunkedMessageBuilder

ChunkedMessageBuilder::ChunkedMessageBuilder(
    const google::protobuf::MessageLite& head, int chunks_field,
    int64_t max_bytes)
    : head_(head.SerializeAsString()),
      chunks_field_(chunks_field),
      max_bytes_(max_bytes) {
  bytes_ = static_cast<int64_t>(head_.size());
}

std::string ChunkedMessageBuilder::ChunkHeader(const std::string& key,
                                               absl::Span<const int64_t> shape,
                                               int64_t offset,
                                               int64_t elements) const {
  // The chunk's own fields, then its part without the payload, serialized by
  // protobuf; the length prefixes around them are ours.
  TensorChunk fields;
  fields.set_key(key);
  fields.mutable_shape()->Assign(shape.begin(), shape.end());
  fields.set_offset(offset);
  Tensor part;
  part.set_dtype(DTYPE_FLOAT32);
  part.add_shape(elements);
  const uint64_t payload = static_cast<uint64_t>(elements) * sizeof(float);

  std::string part_head = part.SerializeAsString();
  AppendLengthPrefix(kTensorData, payload, &part_head);
  const uint64_t part_len = part_head.size() + payload;

  std::string chunk_head = fields.SerializeAsString();
  AppendLengthPrefix(kChunkPart, part_len, &chunk_head);
  chunk_head += part_head;
  const uint64_t chunk_len = chunk_head.size() + payload;

  std::string out;
  out.reserve(chunk_head.size() + 12);
  AppendLengthPrefix(chunks_field_, chunk_len, &out);
  out += chunk_head;
  return out;
}

bool ChunkedMessageBuilder::AddTensor(const std::string& key,
                                      absl::Span<const int64_t> shape,
                                      absl::Span<const float> values,
                                      const std::shared_ptr<const void>& owner,
                                      const Flush& flush) {
  const int64_t n = static_cast<int64_t>(values.size());
  int64_t offset = 0;
  do {
    const int64_t len = std::min(kChunkFloats, n - offset);
    const std::string header = ChunkHeader(key, shape, offset, len);
    if (num_chunks_ > 0 && bytes_ + static_cast<int64_t>(header.size()) +
                                   len * 4 > max_bytes_) {
      if (!flush(Build())) return false;
    }
    Append(header, values.subspan(offset, len), owner);
    offset += len;
  } while (offset < n);
  return true;
}

void ChunkedMessageBuilder::AddChunk(const std::string& key,
                                     absl::Span<const int64_t> shape,
                                     int64_t offset,
                                     absl::Span<const float> part,
                                     const std::shared_ptr<const void>& owner) {
  Append(ChunkHeader(key, shape, offset, part.size()), part, owner);
}

void ChunkedMessageBuilder::Append(const std::string& header,
                                   absl::Span<const float> part,
                                   const std::shared_ptr<const void>& owner) {
  const size_t payload = part.size() * sizeof(float);
  if (owner == nullptr) {  // one slice: the header, then a copy of the payload
    grpc_slice slice = grpc_slice_malloc(header.size() + payload);
    uint8_t* dst = GRPC_SLICE_START_PTR(slice);
    std::memcpy(dst, header.data(), header.size());
    if (payload > 0) std::memcpy(dst + header.size(), part.data(), payload);
    slices_.emplace_back(slice, grpc::Slice::STEAL_REF);
  } else {
    slices_.emplace_back(header);
    if (payload > 0) {
      slices_.emplace_back(const_cast<float*>(part.data()), payload,
                           &ReleaseOwner,
                           new std::shared_ptr<const void>(owner));
    }
  }
  ++num_chunks_;
  bytes_ += static_cast<int64_t>(header.size() + payload);
}

grpc::ByteBuffer ChunkedMessageBuilder::Build() {
  std::vector<grpc::Slice> slices;
  slices.reserve(slices_.size() + 1);
  slices.emplace_back(head_);
  for (grpc::Slice& s : slices_) slices.push_back(std::move(s));
  grpc::ByteBuffer message(slices.data(), slices.size());
  slices_.clear();
  num_chunks_ = 0;
  bytes_ = static_cast<int64_t>(head_.size());
  return message;
}

// --- TensorReader

namespace {

using wire::Is;
using wire::IsInt64s;
using wire::ReadLength;
using wire::ReadTag;
using wire::ReadVarint;
using wire::SkipField;
constexpr auto kVarint = WireFormatLite::WIRETYPE_VARINT;
constexpr auto kLengthDelimited = WireFormatLite::WIRETYPE_LENGTH_DELIMITED;

// Pushes a limit for a nested message whose length prefix comes next, and
// counts it towards the recursion limit, as protobuf does.
bool EnterMessage(CodedInputStream* in, CodedInputStream::Limit* limit) {
  int len;
  if (!ReadLength(in, &len) || !in->IncrementRecursionDepth()) return false;
  *limit = in->PushLimit(len);
  return true;
}

void LeaveMessage(CodedInputStream* in, CodedInputStream::Limit limit) {
  in->PopLimit(limit);
  in->DecrementRecursionDepth();
}

}  // namespace

// A chunk's fields as protobuf parses them: a singular field that comes again
// replaces the earlier value, a repeated one appends, a second `part` merges
// into the first. The payload stays in the message: only where it is.
struct TensorReader::Chunk {
  std::string key;  // empty if it had more than kMaxKeyBytes bytes
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int dtype = 0;
  std::vector<int64_t> part_shape;
  int payload_at = -1;  // position in the message; -1 if no data field
  int payload_bytes = 0;
};

// Parses a TensorChunk whose tag was just read. False if protobuf would not
// parse it.
bool TensorReader::ParseChunk(CodedInputStream* in, Chunk* c) {
  CodedInputStream::Limit chunk_limit;
  if (!EnterMessage(in, &chunk_limit)) return false;
  while (in->BytesUntilLimit() > 0) {
    uint32_t tag;
    if (!ReadTag(in, &tag)) return false;
    if (Is(tag, kChunkKey, kLengthDelimited)) {
      std::string key;
      // A proto3 string: protobuf refuses one that is not UTF-8.
      if (!wire::ReadBytes(in, &key) ||
          !google::protobuf::internal::IsStructurallyValidUTF8(
              key.data(), static_cast<int>(key.size()))) {
        return false;
      }
      if (key.size() > static_cast<size_t>(kMaxKeyBytes)) key.clear();
      c->key = std::move(key);
    } else if (IsInt64s(tag, kChunkShape)) {
      if (!wire::ReadInt64s(in, tag, &c->shape)) return false;
    } else if (Is(tag, kChunkOffset, kVarint)) {
      uint64_t v;
      if (!ReadVarint(in, &v)) return false;
      c->offset = static_cast<int64_t>(v);
    } else if (Is(tag, kChunkPart, kLengthDelimited)) {
      CodedInputStream::Limit part_limit;
      if (!EnterMessage(in, &part_limit)) return false;
      while (in->BytesUntilLimit() > 0) {
        if (!ReadTag(in, &tag)) return false;
        if (Is(tag, kTensorDtype, kVarint)) {
          uint64_t v;
          if (!ReadVarint(in, &v)) return false;
          c->dtype = static_cast<int32_t>(v);  // as protobuf stores an enum
        } else if (IsInt64s(tag, kTensorShape)) {
          if (!wire::ReadInt64s(in, tag, &c->part_shape)) return false;
        } else if (Is(tag, kTensorData, kLengthDelimited)) {
          int len;
          if (!ReadLength(in, &len)) return false;
          c->payload_at = in->CurrentPosition();
          c->payload_bytes = len;
          if (!in->Skip(len)) return false;
        } else if (!SkipField(in, tag)) {
          return false;
        }
      }
      LeaveMessage(in, part_limit);
    } else if (!SkipField(in, tag)) {
      return false;
    }
  }
  LeaveMessage(in, chunk_limit);
  return true;
}

TensorReader::TensorReader(Destination destination, Complete complete)
    : destination_(std::move(destination)), complete_(std::move(complete)) {}

TensorReader::~TensorReader() = default;

absl::Status TensorReader::Deliver(const Chunk& c, CodedInputStream* data) {
  if (c.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk key must have 1 to ", kMaxKeyBytes, " bytes"));
  }
  if (c.part_shape.size() != 1 || c.dtype != DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk of '", c.key, "' must be a 1-D DTYPE_FLOAT32 tensor"));
  }
  const int64_t len = c.part_shape[0];
  if (len < 0 || c.payload_bytes != len * 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of '", c.key, "' declares ", len,
                     " elements but has ", c.payload_bytes, " bytes"));
  }
  if (!pending()) {
    absl::StatusOr<int64_t> n = NumElements(c.shape);
    if (!n.ok()) return n.status();
    if (c.offset != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk of '", c.key, "' at offset ", c.offset, ", expected 0"));
    }
    if (len > *n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks of '", c.key, "' run past its ", *n, " elements"));
    }
    absl::StatusOr<float*> dst = destination_(c.key, c.shape, *n);
    if (!dst.ok()) return dst.status();
    key_ = c.key;
    shape_ = c.shape;
    values_ = *dst;
    total_ = *n;
    received_ = 0;
  } else if (c.key != key_ || c.shape != shape_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk of '", c.key, "' arrived while '", key_, "' is incomplete"));
  } else if (c.offset != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of '", c.key, "' at offset ", c.offset,
                     ", expected ", received_));
  } else if (len > total_ - received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunks of '", c.key, "' run past its ", total_, " elements"));
  }
  if (len > 0 && !data->Skip(c.payload_at - data->CurrentPosition())) {
    return Malformed("chunk payload");  // the structure was checked before
  }
  // Read and checked in blocks that stay in the core's cache, so the check
  // does not fetch the payload from memory a second time.
  float* const dst = values_ + received_;
  for (int64_t at = 0; at < len; at += kCheckBlockFloats) {
    const int64_t n = std::min(kCheckBlockFloats, len - at);
    if (!data->ReadRaw(dst + at, static_cast<int>(n * 4))) {
      return Malformed("truncated chunk payload");
    }
    if (const int64_t i = static_cast<int64_t>(
            util::FirstNonFinite(absl::MakeConstSpan(dst + at, n)));
        i < n) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk of '", c.key, "': element ", received_ + at + i,
                       " is not finite"));
    }
  }
  received_ += len;
  if (received_ < total_) return absl::OkStatus();
  const std::string key = std::move(key_);
  key_.clear();
  return complete_(key);
}

absl::Status TensorReader::Read(const grpc::ByteBuffer& message,
                                int chunks_field,
                                google::protobuf::MessageLite* head,
                                const std::function<absl::Status()>& check_head) {
  head->Clear();
  const size_t size = message.Length();
  if (size > static_cast<size_t>(INT_MAX) - 16) {
    return Malformed("message over 2 GiB");  // protobuf's limit too
  }
  // First pass: the whole message's structure, exactly as protobuf parses
  // it, before anything reaches the callbacks; the chunks' fields are kept,
  // the fields that are not chunks become `head`. Payloads are skipped, not
  // copied.
  chunks_.clear();
  {
    std::string others;
    {
      grpc::ByteBuffer shared(message);  // shares the slices
      grpc::ProtoBufferReader stream(&shared);
      CodedInputStream in(&stream);
      in.PushLimit(static_cast<int>(size));
      google::protobuf::io::StringOutputStream others_stream(&others);
      google::protobuf::io::CodedOutputStream others_out(&others_stream);
      for (int chunk = 0; in.BytesUntilLimit() > 0;) {
        uint32_t tag;
        if (!ReadTag(&in, &tag)) return Malformed("field tag");
        if (Is(tag, chunks_field, kLengthDelimited)) {
          chunks_.emplace_back();
          if (!ParseChunk(&in, &chunks_.back())) {
            return Malformed(absl::StrCat("chunk ", chunk));
          }
          ++chunk;
        } else if (!SkipField(&in, tag, &others_out)) {
          return Malformed(absl::StrCat("field ", wire::FieldNumber(tag)));
        }
      }
    }
    if (!head->ParseFromString(others)) return Malformed("message head");
  }
  if (check_head != nullptr) {
    if (absl::Status s = check_head(); !s.ok()) return s;
  }
  // Second pass: each chunk's payload straight into its tensor, read through
  // a stream that only moves forward.
  grpc::ByteBuffer shared(message);
  grpc::ProtoBufferReader data_stream(&shared);
  CodedInputStream data(&data_stream);
  data.PushLimit(static_cast<int>(size));
  for (const Chunk& c : chunks_) {
    if (absl::Status s = Deliver(c, &data); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace bnps::proto
