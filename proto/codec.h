// Conversions between wire messages and host values: tensors as raw
// little-endian bytes, BN moments/sums/running stats, chunked tensors, and
// absl::Status <-> grpc::Status (the one place that converts). The bulk
// messages are read and written by proto/tensor_wire.h; the BN stream's are
// protobuf's generated classes.
//
// Decoding validates everything that arrives over the network and returns
// INVALID_ARGUMENT naming what is wrong: dtype, shape, byte size, non-finite
// values (except in backward sums: bn::BackwardSums says why), limits. These decodes are the trust boundary of the BN statistics:
// what they return goes on to functions that REQUIRE validated input and do
// not check it again (server/bn_aggregator.h, bn::MixIntoRunningStats,
// bn::AccumulateSums). Thread-safety: functions are pure.

#ifndef BNPS_PROTO_CODEC_H_
#define BNPS_PROTO_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "grpcpp/support/status.h"
#include "proto/bnps.pb.h"

namespace bnps::proto {

void EncodeFloat32(absl::Span<const float> values,
                   absl::Span<const int64_t> shape, Tensor* out);
void EncodeFloat64(absl::Span<const double> values, Tensor* out);  // 1-D

// INVALID_ARGUMENT unless `t` is float32 with product(shape) elements, the byte
// size matches, and every value is finite. `want_shape`, if not empty, must
// equal t.shape.
absl::StatusOr<std::vector<float>> DecodeFloat32(
    const Tensor& t, absl::Span<const int64_t> want_shape = {});

// The BN statistics to and from the messages of the BN stream.
void EncodeMoments(const bn::Moments& m, BnMoments* out);
// Validated with bn::ValidateMoments; `channels` < 0 accepts any count.
absl::StatusOr<bn::Moments> DecodeMoments(const BnMoments& m,
                                          int64_t channels = -1);

void EncodeSums(const bn::BackwardSums& s, BnSums* out);
// Two arrays of the same non-zero size (`channels` where >= 0), of any
// values.
absl::StatusOr<bn::BackwardSums> DecodeSums(const BnSums& s,
                                            int64_t channels = -1);

void EncodeRunning(const bn::RunningStats& r, BnRunningStats* out);
absl::StatusOr<bn::RunningStats> DecodeRunning(const BnRunningStats& r,
                                               int64_t channels = -1);

// Number of elements of `shape`; INVALID_ARGUMENT for negative dimensions or
// more than kMaxTensorElements.
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape);

// Cuts `values` (of the given full shape) into chunks of at most
// `chunk_floats` elements, appended to `out`: the bulk messages as the
// generated classes build them. bnps's own client and server frame those
// messages with proto/tensor_wire.h instead, which writes the same bytes
// without copying tensors through protobuf; this is for peers and tests.
void AppendChunks(const std::string& key, absl::Span<const int64_t> shape,
                  absl::Span<const float> values, int64_t chunk_floats,
                  google::protobuf::RepeatedPtrField<TensorChunk>* out);

// The one place statuses cross between Abseil and gRPC.
grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

// The one place statuses cross the BN messages' `code` and `message` fields
// (BnResponse, BnHelloReply): the code is absl::StatusCode's number, 0 for
// OK. A code outside Abseil's range (a peer of another version) is UNKNOWN,
// naming the number; `context` (if not empty) leads the message.
int WireCode(const absl::Status& s);
absl::Status StatusFromWire(int code, absl::string_view message,
                            absl::string_view context = "");

}  // namespace bnps::proto

#endif  // BNPS_PROTO_CODEC_H_
