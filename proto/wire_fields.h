// Small pieces of protobuf's wire format shared by the hand-framed messages
// (proto/tensor_wire.h): varints and field prefixes to write, and readers that
// accept exactly what protobuf's own parser accepts.
//
// The readers follow the rules of the parser the generated classes use
// (protobuf 3.21's ParseContext), which are stricter than CodedInputStream's
// own: a tag has at most 5 bytes and a field number of at least 1; a length
// has at most 5 bytes, is at most INT_MAX - 16 and stays inside the message
// that holds it (CodedInputStream::PushLimit would silently clamp it); a varint
// has at most 10 bytes; wire types 6 and 7 are invalid; an END_GROUP tag ends
// only the group it opened; nested messages and groups together go at most
// CodedInputStream::GetDefaultRecursionLimit() deep. Each reader works under a
// limit (the caller pushes one for the whole message first), so "at the end"
// is BytesUntilLimit() == 0.
//
// Thread-safety: functions are pure or work on the stream they are given.

#ifndef BNPS_PROTO_WIRE_FIELDS_H_
#define BNPS_PROTO_WIRE_FIELDS_H_

#include <climits>
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
using google::protobuf::io::CodedOutputStream;

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

inline int FieldNumber(uint32_t tag) {
  return WireFormatLite::GetTagFieldNumber(tag);
}

// True if `tag` is field `field` with wire type `type`. A known field number
// with another wire type is an unknown field to protobuf (except that a
// repeated scalar may come packed or not).
inline bool Is(uint32_t tag, int field, WireFormatLite::WireType type) {
  return tag == WireFormatLite::MakeTag(field, type);
}

// Reads a tag: at most 5 bytes, field number >= 1. REQUIRES: BytesUntilLimit()
// > 0.
inline bool ReadTag(CodedInputStream* in, uint32_t* tag) {
  const int start = in->CurrentPosition();
  if (!in->ReadVarint32(tag)) return false;
  return in->CurrentPosition() - start <= 5 && FieldNumber(*tag) != 0;
}

// Reads a length prefix: at most 5 bytes, at most INT_MAX - 16, and no
// further than the limit in force.
inline bool ReadLength(CodedInputStream* in, int* len) {
  const int start = in->CurrentPosition();
  uint64_t v;
  if (!in->ReadVarint64(&v)) return false;
  if (in->CurrentPosition() - start > 5 || v > uint64_t{INT_MAX} - 16) {
    return false;
  }
  *len = static_cast<int>(v);
  const int left = in->BytesUntilLimit();
  return left < 0 || *len <= left;
}

// Reads a varint (at most 10 bytes; bits past 64 are dropped, as protobuf
// does).
inline bool ReadVarint(CodedInputStream* in, uint64_t* v) {
  return in->ReadVarint64(v);
}

// Reads a length-delimited field's bytes after its tag.
inline bool ReadBytes(CodedInputStream* in, std::string* out) {
  int len;
  return ReadLength(in, &len) && in->ReadString(out, len);
}

// True if `tag` is repeated int64 field `field`, unpacked or packed (with
// another wire type it is an unknown field).
inline bool IsInt64s(uint32_t tag, int field) {
  return Is(tag, field, WireFormatLite::WIRETYPE_VARINT) ||
         Is(tag, field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}

// Reads the value(s) of a repeated int64 field whose tag (IsInt64s) was just
// read, appending to `out`. False if malformed.
inline bool ReadInt64s(CodedInputStream* in, uint32_t tag,
                       std::vector<int64_t>* out) {
  uint64_t v;
  if (WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT) {
    if (!ReadVarint(in, &v)) return false;
    out->push_back(static_cast<int64_t>(v));
    return true;
  }
  int len;
  if (!ReadLength(in, &len)) return false;
  const CodedInputStream::Limit limit = in->PushLimit(len);
  while (in->BytesUntilLimit() > 0) {
    if (!ReadVarint(in, &v)) return false;
    out->push_back(static_cast<int64_t>(v));
  }
  in->PopLimit(limit);
  return true;
}

inline bool SkipGroup(CodedInputStream* in, int field, CodedOutputStream* out);

// Skips the field whose tag was just read, as protobuf keeps an unknown field;
// with `out`, writes the field (tag included) there, with the same meaning.
// False if malformed.
inline bool SkipField(CodedInputStream* in, uint32_t tag,
                      CodedOutputStream* out = nullptr) {
  if (out != nullptr && WireFormatLite::GetTagWireType(tag) !=
                            WireFormatLite::WIRETYPE_END_GROUP) {
    out->WriteTag(tag);
  }
  switch (WireFormatLite::GetTagWireType(tag)) {
    case WireFormatLite::WIRETYPE_VARINT: {
      uint64_t v;
      if (!ReadVarint(in, &v)) return false;
      if (out != nullptr) out->WriteVarint64(v);
      return true;
    }
    case WireFormatLite::WIRETYPE_FIXED64: {
      uint64_t v;
      if (!in->ReadLittleEndian64(&v)) return false;
      if (out != nullptr) out->WriteLittleEndian64(v);
      return true;
    }
    case WireFormatLite::WIRETYPE_FIXED32: {
      uint32_t v;
      if (!in->ReadLittleEndian32(&v)) return false;
      if (out != nullptr) out->WriteLittleEndian32(v);
      return true;
    }
    case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
      int len;
      if (!ReadLength(in, &len)) return false;
      if (out == nullptr) return in->Skip(len);
      std::string bytes;
      if (!in->ReadString(&bytes, len)) return false;
      out->WriteVarint32(static_cast<uint32_t>(len));
      out->WriteString(bytes);
      return true;
    }
    case WireFormatLite::WIRETYPE_START_GROUP:
      return SkipGroup(in, FieldNumber(tag), out);
    default:  // END_GROUP outside its group; wire types 6 and 7
      return false;
  }
}

// Skips the rest of group `field` up to and including its END_GROUP tag
// (written to `out` if given). Counts towards the recursion limit.
inline bool SkipGroup(CodedInputStream* in, int field, CodedOutputStream* out) {
  if (!in->IncrementRecursionDepth()) return false;
  while (in->BytesUntilLimit() > 0) {
    uint32_t tag;
    if (!ReadTag(in, &tag)) return false;
    if (WireFormatLite::GetTagWireType(tag) ==
        WireFormatLite::WIRETYPE_END_GROUP) {
      if (FieldNumber(tag) != field) return false;
      in->DecrementRecursionDepth();
      if (out != nullptr) out->WriteTag(tag);
      return true;
    }
    if (!SkipField(in, tag, out)) return false;
  }
  return false;  // the enclosing message ended inside the group
}

}  // namespace bnps::proto::wire

#endif  // BNPS_PROTO_WIRE_FIELDS_H_
