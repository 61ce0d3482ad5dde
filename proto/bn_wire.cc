#include "proto/bn_wire.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/types/span.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpc/slice.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "proto/wire_fields.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "bnps sends statistics as little-endian bytes with memcpy");

namespace bnps::proto {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using wire::IsLengthDelimited;
using wire::IsVarint;
using wire::Malformed;
using wire::PutVarint;
using wire::VarintSize;

static_assert(BnRequest::kIdFieldNumber == 1 && BnResponse::kIdFieldNumber == 1,
              "FrameBnId and PeekBnId assume the id is field 1 of both");

// --- Writing

uint8_t* PutTag(int field, WireFormatLite::WireType type, uint8_t* p) {
  return PutVarint(WireFormatLite::MakeTag(field, type), p);
}

size_t TagSize(int field) {
  return VarintSize(
      WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_VARINT));
}

// A length-delimited field of `len` bytes, prefix included.
size_t FieldSize(int field, size_t len) {
  return TagSize(field) + VarintSize(len) + len;
}

// A statistics message (BnMoments, BnSums, BnRunningStats): an optional count
// and two per-channel arrays, each a float64 Tensor.
struct StatsMessage {
  int count_field = 0;  // 0: the message has none
  int64_t count = 0;
  int fields[2];
  absl::Span<const double> arrays[2];
};

StatsMessage Of(const bn::Moments& m) {
  return {BnMoments::kCountFieldNumber,
          m.count,
          {BnMoments::kMeanFieldNumber, BnMoments::kM2FieldNumber},
          {m.mean, m.m2}};
}
StatsMessage Of(const bn::BackwardSums& s) {
  return {0,
          0,
          {BnSums::kSumDyFieldNumber, BnSums::kSumDyXhatFieldNumber},
          {s.sum_dy, s.sum_dy_xhat}};
}
StatsMessage Of(const bn::RunningStats& r) {
  return {0,
          0,
          {BnRunningStats::kMeanFieldNumber, BnRunningStats::kVarFieldNumber},
          {r.mean, r.var}};
}

// A 1-D float64 Tensor of n elements, as protobuf writes it (the data left out
// when empty).
size_t TensorSize(size_t n) {
  const size_t bytes = n * sizeof(double);
  return TagSize(Tensor::kDtypeFieldNumber) + VarintSize(DTYPE_FLOAT64) +
         FieldSize(Tensor::kShapeFieldNumber, VarintSize(n)) +
         (bytes > 0 ? FieldSize(Tensor::kDataFieldNumber, bytes) : 0);
}

uint8_t* PutTensor(absl::Span<const double> values, uint8_t* p) {
  const size_t n = values.size();
  const size_t bytes = n * sizeof(double);
  p = PutTag(Tensor::kDtypeFieldNumber, WireFormatLite::WIRETYPE_VARINT, p);
  p = PutVarint(DTYPE_FLOAT64, p);
  p = PutTag(Tensor::kShapeFieldNumber,
             WireFormatLite::WIRETYPE_LENGTH_DELIMITED, p);
  p = PutVarint(VarintSize(n), p);
  p = PutVarint(n, p);
  if (bytes > 0) {
    p = PutTag(Tensor::kDataFieldNumber,
               WireFormatLite::WIRETYPE_LENGTH_DELIMITED, p);
    p = PutVarint(bytes, p);
    std::memcpy(p, values.data(), bytes);
    p += bytes;
  }
  return p;
}

size_t StatsSize(const StatsMessage& m) {
  size_t size = 0;
  if (m.count_field != 0 && m.count != 0) {
    size += TagSize(m.count_field) + VarintSize(static_cast<uint64_t>(m.count));
  }
  for (int i = 0; i < 2; ++i) {
    size += FieldSize(m.fields[i], TensorSize(m.arrays[i].size()));
  }
  return size;
}

uint8_t* PutStats(const StatsMessage& m, uint8_t* p) {
  if (m.count_field != 0 && m.count != 0) {
    p = PutTag(m.count_field, WireFormatLite::WIRETYPE_VARINT, p);
    p = PutVarint(static_cast<uint64_t>(m.count), p);
  }
  for (int i = 0; i < 2; ++i) {
    p = PutTag(m.fields[i], WireFormatLite::WIRETYPE_LENGTH_DELIMITED, p);
    p = PutVarint(TensorSize(m.arrays[i].size()), p);
    p = PutTensor(m.arrays[i], p);
  }
  return p;
}

// --- Reading

// Reads a Tensor's fields into `t`, merging as protobuf does (the shape
// appends, the dtype and the data replace). `message_bytes`: the size of the
// whole message being read.
bool ReadChannels(CodedInputStream* in, int64_t message_bytes,
                  WireChannels* t) {
  int len;
  if (!in->ReadVarintSizeAsInt(&len)) return false;
  const CodedInputStream::Limit limit = in->PushLimit(len);
  while (const uint32_t tag = in->ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (field == Tensor::kDtypeFieldNumber && IsVarint(tag)) {
      uint32_t v;
      if (!in->ReadVarint32(&v)) return false;
      t->dtype = static_cast<int>(v);
    } else if (field == Tensor::kShapeFieldNumber) {
      if (!wire::ReadInt64s(in, tag, &t->shape)) return false;
    } else if (field == Tensor::kDataFieldNumber && IsLengthDelimited(tag)) {
      int bytes;
      if (!in->ReadVarintSizeAsInt(&bytes)) return false;
      // Only bytes that are there: a length is not trusted with an allocation.
      if (bytes > in->BytesUntilLimit() ||
          bytes > message_bytes - in->CurrentPosition()) {
        return false;
      }
      t->bytes = bytes;
      if (bytes % sizeof(double) == 0) {
        t->values.resize(bytes / sizeof(double));
        if (bytes > 0 && !in->ReadRaw(t->values.data(), bytes)) return false;
      } else {
        t->values.clear();
        if (!in->Skip(bytes)) return false;
      }
    } else if (field == Tensor::kDtypeFieldNumber ||
               field == Tensor::kDataFieldNumber ||
               !WireFormatLite::SkipField(in, tag)) {
      return false;
    }
  }
  if (!wire::EndedAtLimit(*in)) return false;
  in->PopLimit(limit);
  return true;
}

// Reads a statistics message: `count` (may be null: the message has none)
// under `count_field`, and arrays under `fields`.
bool ReadStats(CodedInputStream* in, int64_t message_bytes, int count_field,
               int64_t* count, const int (&fields)[2],
               WireChannels* const (&arrays)[2]) {
  int len;
  if (!in->ReadVarintSizeAsInt(&len)) return false;
  const CodedInputStream::Limit limit = in->PushLimit(len);
  while (const uint32_t tag = in->ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (count != nullptr && field == count_field) {
      uint64_t v;
      if (!IsVarint(tag) || !in->ReadVarint64(&v)) return false;
      *count = static_cast<int64_t>(v);
    } else if (field == fields[0] || field == fields[1]) {
      if (!IsLengthDelimited(tag)) return false;
      if (!ReadChannels(in, message_bytes,
                        arrays[field == fields[0] ? 0 : 1])) {
        return false;
      }
    } else if (!WireFormatLite::SkipField(in, tag)) {
      return false;
    }
  }
  if (!wire::EndedAtLimit(*in)) return false;
  in->PopLimit(limit);
  return true;
}

}  // namespace

grpc::Slice FrameBn(const google::protobuf::MessageLite& head,
                    BnStatsFields fields, const BnStatsOut& stats) {
  const size_t head_size = head.ByteSizeLong();
  size_t size = head_size;
  StatsMessage parts[3];
  int fields_of[3];
  int n = 0;
  if (stats.moments != nullptr) {
    parts[n] = Of(*stats.moments);
    fields_of[n++] = fields.moments;
  }
  if (stats.sums != nullptr) {
    parts[n] = Of(*stats.sums);
    fields_of[n++] = fields.sums;
  }
  if (stats.running != nullptr) {
    parts[n] = Of(*stats.running);
    fields_of[n++] = fields.running;
  }
  size_t part_size[3];
  for (int i = 0; i < n; ++i) {
    part_size[i] = StatsSize(parts[i]);
    size += FieldSize(fields_of[i], part_size[i]);
  }
  grpc_slice slice = grpc_slice_malloc(size);
  uint8_t* p = GRPC_SLICE_START_PTR(slice);
  p = head.SerializeWithCachedSizesToArray(p);
  for (int i = 0; i < n; ++i) {
    p = PutTag(fields_of[i], WireFormatLite::WIRETYPE_LENGTH_DELIMITED, p);
    p = PutVarint(part_size[i], p);
    p = PutStats(parts[i], p);
  }
  return grpc::Slice(slice, grpc::Slice::STEAL_REF);
}

grpc::Slice FrameBnId(uint64_t id) {
  uint8_t bytes[kMaxBnIdBytes];
  uint8_t* p =
      PutTag(BnRequest::kIdFieldNumber, WireFormatLite::WIRETYPE_VARINT, bytes);
  p = PutVarint(id, p);
  return grpc::Slice(bytes, p - bytes);
}

absl::Status ParseBn(const grpc::ByteBuffer& message, BnStatsFields fields,
                     google::protobuf::MessageLite* head, BnStatsIn* stats) {
  head->Clear();
  *stats = BnStatsIn();
  grpc::ByteBuffer shared(message);  // shares the slices
  grpc::ProtoBufferReader stream(&shared);
  CodedInputStream in(&stream);
  const int64_t bytes = static_cast<int64_t>(message.Length());
  std::string others;  // the fields that are not statistics, for `head`
  google::protobuf::io::StringOutputStream others_stream(&others);
  google::protobuf::io::CodedOutputStream others_out(&others_stream);
  static constexpr int kSums[2] = {BnSums::kSumDyFieldNumber,
                                   BnSums::kSumDyXhatFieldNumber};
  static constexpr int kRunning[2] = {BnRunningStats::kMeanFieldNumber,
                                      BnRunningStats::kVarFieldNumber};
  static constexpr int kMoments[2] = {BnMoments::kMeanFieldNumber,
                                      BnMoments::kM2FieldNumber};
  while (const uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const bool stats_field = field == fields.moments || field == fields.sums ||
                             field == fields.running;
    if (stats_field && !IsLengthDelimited(tag)) {
      return Malformed("a BN statistics field that is not a message");
    }
    if (field == fields.moments) {
      WireMoments& m = stats->moments;
      if (!ReadStats(&in, bytes, BnMoments::kCountFieldNumber, &m.count,
                     kMoments, {&m.mean, &m.m2})) {
        return Malformed("BN moments");
      }
    } else if (field == fields.sums) {
      WireSums& s = stats->sums;
      if (!ReadStats(&in, bytes, 0, nullptr, kSums,
                     {&s.sum_dy, &s.sum_dy_xhat})) {
        return Malformed("BN sums");
      }
    } else if (field == fields.running) {
      WireRunning& r = stats->running;
      if (!ReadStats(&in, bytes, 0, nullptr, kRunning, {&r.mean, &r.var})) {
        return Malformed("BN running stats");
      }
    } else if (!WireFormatLite::SkipField(&in, tag, &others_out)) {
      return Malformed("BN message field");
    }
  }
  if (!in.ConsumedEntireMessage()) return Malformed("BN message");
  others_out.Trim();
  if (!head->ParseFromString(others)) return Malformed("BN message head");
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PeekBnId(const grpc::ByteBuffer& message) {
  grpc::ByteBuffer shared(message);
  grpc::ProtoBufferReader stream(&shared);
  CodedInputStream in(&stream);
  uint64_t id = 0;  // the last one wins, as in protobuf
  while (const uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) == BnRequest::kIdFieldNumber &&
        IsVarint(tag)) {
      if (!in.ReadVarint64(&id)) return Malformed("BN message id");
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return Malformed("BN message field");
    }
  }
  if (!in.ConsumedEntireMessage()) return Malformed("BN message");
  return id;
}

}  // namespace bnps::proto
