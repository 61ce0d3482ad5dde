#include "proto/tensor_wire.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "util/finite.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
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
using wire::IsLengthDelimited;
using wire::IsVarint;
using wire::Malformed;
using wire::ReadInt64s;

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

// A chunk's fields as far as they were read.
struct TensorReader::Chunk {
  std::string key;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int dtype = 0;
  std::vector<int64_t> part_shape;
  bool payload_read = false;
};

TensorReader::TensorReader(Destination destination, Complete complete)
    : destination_(std::move(destination)), complete_(std::move(complete)) {}

absl::Status TensorReader::Read(const grpc::ByteBuffer& message,
                                int chunks_field,
                                google::protobuf::MessageLite* head,
                                const std::function<absl::Status()>& check_head) {
  head->Clear();
  grpc::ByteBuffer shared(message);  // shares the slices
  grpc::ProtoBufferReader stream(&shared);
  CodedInputStream in(&stream);
  std::string others;  // the fields that are not chunks, for `head`
  google::protobuf::io::StringOutputStream others_stream(&others);
  google::protobuf::io::CodedOutputStream others_out(&others_stream);

  // Reads one chunk's payload of `bytes` bytes (0 if it had none) straight
  // into its tensor, after checking the chunk's fields.
  auto payload = [&](Chunk& c, int bytes) -> absl::Status {
    c.payload_read = true;
    if (c.key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk key must have 1 to ", kMaxKeyBytes, " bytes"));
    }
    if (!pending()) {
      absl::StatusOr<int64_t> n = NumElements(c.shape);
      if (!n.ok()) return n.status();
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
    }
    if (c.offset != received_) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk of '", c.key, "' at offset ", c.offset,
                       ", expected ", received_));
    }
    if (c.part_shape.size() != 1 || c.dtype != DTYPE_FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk of '", c.key, "' must be a 1-D DTYPE_FLOAT32 tensor"));
    }
    const int64_t len = c.part_shape[0];
    if (len < 0 || len > total_ - received_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks of '", c.key, "' run past its ", total_, " elements"));
    }
    if (static_cast<int64_t>(bytes) != len * 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk of '", c.key, "' declares ", len,
                       " elements but has ", bytes, " bytes"));
    }
    // Read and checked in blocks that stay in the core's cache, so the check
    // does not fetch the payload from memory a second time.
    float* const dst = values_ + received_;
    for (int64_t at = 0; at < len; at += kCheckBlockFloats) {
      const int64_t n = std::min(kCheckBlockFloats, len - at);
      if (!in.ReadRaw(dst + at, static_cast<int>(n * 4))) {
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
  };

  // Reads the part (a Tensor) of chunk `c`; its payload goes to the tensor.
  auto read_part = [&](Chunk& c) -> absl::Status {
    int len;
    if (!in.ReadVarintSizeAsInt(&len)) return Malformed("chunk part length");
    const CodedInputStream::Limit limit = in.PushLimit(len);
    while (const uint32_t tag = in.ReadTag()) {
      const int field = WireFormatLite::GetTagFieldNumber(tag);
      if (field == kTensorDtype || field == kTensorShape ||
          field == kTensorData) {
        if (c.payload_read) {
          return Malformed("a chunk field after its payload");
        }
      }
      if (field == kTensorDtype && IsVarint(tag)) {
        uint32_t v;
        if (!in.ReadVarint32(&v)) return Malformed("chunk dtype");
        c.dtype = static_cast<int>(v);
      } else if (field == kTensorShape) {
        if (!ReadInt64s(&in, tag, &c.part_shape)) {
          return Malformed("chunk part shape");
        }
      } else if (field == kTensorData && IsLengthDelimited(tag)) {
        int bytes;
        if (!in.ReadVarintSizeAsInt(&bytes)) {
          return Malformed("chunk payload length");
        }
        if (absl::Status s = payload(c, bytes); !s.ok()) return s;
      } else if (field == kTensorDtype || field == kTensorData ||
                 !WireFormatLite::SkipField(&in, tag)) {
        return Malformed("chunk part field");
      }
    }
    if (!wire::EndedAtLimit(in)) return Malformed("chunk part");
    in.PopLimit(limit);
    return absl::OkStatus();
  };

  auto read_chunk = [&]() -> absl::Status {
    int len;
    if (!in.ReadVarintSizeAsInt(&len)) return Malformed("chunk length");
    const CodedInputStream::Limit limit = in.PushLimit(len);
    Chunk c;
    bool has_part = false;
    while (const uint32_t tag = in.ReadTag()) {
      const int field = WireFormatLite::GetTagFieldNumber(tag);
      if (c.payload_read && (field == kChunkKey || field == kChunkShape ||
                             field == kChunkOffset || field == kChunkPart)) {
        return Malformed("a chunk field after its payload");
      }
      if (field == kChunkKey && IsLengthDelimited(tag)) {
        int n;
        if (!in.ReadVarintSizeAsInt(&n)) return Malformed("chunk key");
        if (n > kMaxKeyBytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              "chunk key must have 1 to ", kMaxKeyBytes, " bytes"));
        }
        if (!in.ReadString(&c.key, n)) return Malformed("chunk key");
      } else if (field == kChunkShape) {
        if (!ReadInt64s(&in, tag, &c.shape)) return Malformed("chunk shape");
      } else if (field == kChunkOffset && IsVarint(tag)) {
        uint64_t v;
        if (!in.ReadVarint64(&v)) return Malformed("chunk offset");
        c.offset = static_cast<int64_t>(v);
      } else if (field == kChunkPart && IsLengthDelimited(tag)) {
        if (has_part) return Malformed("a chunk with two parts");
        has_part = true;
        if (absl::Status s = read_part(c); !s.ok()) return s;
      } else if (field == kChunkKey || field == kChunkOffset ||
                 field == kChunkPart || !WireFormatLite::SkipField(&in, tag)) {
        return Malformed("chunk field");
      }
    }
    if (!wire::EndedAtLimit(in)) return Malformed("chunk");
    in.PopLimit(limit);
    // Protobuf leaves out an empty payload.
    if (!c.payload_read) return payload(c, 0);
    return absl::OkStatus();
  };

  bool head_checked = false;
  auto parse_head = [&]() -> absl::Status {
    others_out.Trim();
    if (!head->ParseFromString(others)) return Malformed("message head");
    return absl::OkStatus();
  };
  while (const uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) == chunks_field &&
        IsLengthDelimited(tag)) {
      if (check_head != nullptr && !head_checked) {
        head_checked = true;
        if (absl::Status s = parse_head(); !s.ok()) return s;
        if (absl::Status s = check_head(); !s.ok()) return s;
      }
      if (absl::Status s = read_chunk(); !s.ok()) return s;
    } else if (head_checked) {
      return Malformed("a message field after its chunks");
    } else if (!WireFormatLite::SkipField(&in, tag, &others_out)) {
      return Malformed("message field");
    }
  }
  if (!in.ConsumedEntireMessage()) return Malformed("message");
  if (head_checked) return absl::OkStatus();
  if (absl::Status s = parse_head(); !s.ok()) return s;
  if (check_head != nullptr) return check_head();
  return absl::OkStatus();
}

}  // namespace bnps::proto
