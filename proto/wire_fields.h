// Small pieces of protobuf's wire format shared by the hand-framed messages
// (proto/tensor_wire.h): varints and field prefixes to write,
// and checks and readers for fields being parsed.
//
// Thread-safety: functions are pure.

#ifndef BNPS_PROTO_WIRE_FIELDS_H_
#define BNPS_PROTO_WIRE_FIELDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace bnps::proto::wire {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// The bytes of `v` as a varint (1 to 10).
inline size_t VarintSize(uint64_t v) {
  size_t n = 1;
  for (; v >= 0x80; v >>= 7) ++n;
  return n;
}

// Writes `v` as a varint at `p`; returns the end of what it wrote.
inline uint8_t* PutVarint(uint64_t v, uint8_t* p) {
  for (; v >= 0x80; v >>= 7) *p++ = static_cast<uint8_t>(v | 0x80);
  *p++ = static_cast<uint8_t>(v);
  return p;
}

inline void AppendVarint(uint64_t v, std::string* out) {
  uint8_t bytes[10];
  out->append(reinterpret_cast<const char*>(bytes),
              PutVarint(v, bytes) - bytes);
}

// The tag and length prefix of a length-delimited field of `len` bytes.
inline void AppendLengthPrefix(int field, uint64_t len, std::string* out) {
  AppendVarint(
      WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED),
      out);
  AppendVarint(len, out);
}

inline absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed message: ", what));
}

inline bool IsLengthDelimited(uint32_t tag) {
  return WireFormatLite::GetTagWireType(tag) ==
         WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
}

inline bool IsVarint(uint32_t tag) {
  return WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT;
}

// True if a nested message read under a pushed limit ended where its length
// said. ReadTag returns 0 at the limit and also where the input runs out; only
// the first is a whole message.
inline bool EndedAtLimit(CodedInputStream& in) {
  return in.ConsumedEntireMessage() && in.BytesUntilLimit() == 0;
}

// Reads a repeated int64 field, packed or not, appending to `out`.
inline bool ReadInt64s(CodedInputStream* in, uint32_t tag,
                       std::vector<int64_t>* out) {
  if (IsVarint(tag)) {
    uint64_t v;
    if (!in->ReadVarint64(&v)) return false;
    out->push_back(static_cast<int64_t>(v));
    return true;
  }
  if (!IsLengthDelimited(tag)) return false;
  int len;
  if (!in->ReadVarintSizeAsInt(&len)) return false;
  const CodedInputStream::Limit limit = in->PushLimit(len);
  while (in->BytesUntilLimit() > 0) {
    uint64_t v;
    if (!in->ReadVarint64(&v)) return false;
    out->push_back(static_cast<int64_t>(v));
  }
  in->PopLimit(limit);
  return true;
}

}  // namespace bnps::proto::wire

#endif  // BNPS_PROTO_WIRE_FIELDS_H_
