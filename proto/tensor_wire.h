// The bulk messages of the protocol (PushGradientsRequest,
// PullParametersResponse: a few scalar fields and many TensorChunks) framed
// and parsed by hand, so that tensor bytes move between the caller's memory
// and gRPC's buffers with at most one copy.
//
// The bytes are protobuf's wire format for these messages, so a peer that uses
// the generated classes reads and writes the same messages: the builder emits
// the message's other fields, then each chunk's fields in field-number order
// with the payload last. The reader accepts exactly the bytes protobuf's
// parser accepts for the message, and reads them as it would: any field
// order, packed or unpacked shapes, a later value of a singular field
// replacing an earlier one, a repeated `part` merged into the first, a known
// field with another wire type kept as an unknown field, unknown fields
// skipped; and it refuses what protobuf refuses (a length past the end of
// its message, a truncated or overlong varint or tag, field number 0, a
// chunk key that is not UTF-8, unbalanced groups, nesting past the recursion
// limit: proto/wire_fields.h). proto/tensor_wire_protobuf_test.cc compares
// the two on hand-made and mutated messages.
//
// Thread-safety: thread-compatible.

#ifndef BNPS_PROTO_TENSOR_WIRE_H_
#define BNPS_PROTO_TENSOR_WIRE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace bnps::proto {

// Builds messages of `head` (the message with no chunks) followed by
// TensorChunks as repeated field `chunks_field`, each at most `max_bytes`
// unless a single chunk is larger.
class ChunkedMessageBuilder {
 public:
  // Takes a full message; returns false if it could not be sent.
  using Flush = std::function<bool(grpc::ByteBuffer message)>;

  ChunkedMessageBuilder(const google::protobuf::MessageLite& head,
                        int chunks_field, int64_t max_bytes);

  // Appends tensor `key` of `shape` with `values` as chunks of at most
  // kChunkFloats elements (an empty tensor is one empty chunk). Before a
  // chunk that would take the message past max_bytes, the message so far goes
  // to `flush` and the builder starts over. Returns false as soon as flush
  // does. Payloads are copied if `owner` is null; otherwise they are
  // referenced in place, and `owner` keeps them alive and unchanged until gRPC
  // releases the messages (after the call, at the latest).
  bool AddTensor(const std::string& key, absl::Span<const int64_t> shape,
                 absl::Span<const float> values,
                 const std::shared_ptr<const void>& owner, const Flush& flush);

  // Appends the chunk [offset, offset + part.size()) of tensor `key`, copied
  // or referenced as above, with no size check.
  void AddChunk(const std::string& key, absl::Span<const int64_t> shape,
                int64_t offset, absl::Span<const float> part,
                const std::shared_ptr<const void>& owner);

  int num_chunks() const { return num_chunks_; }

  // The message; the builder starts over with the same head.
  grpc::ByteBuffer Build();

 private:
  // The chunk's fields up to its payload's length prefix.
  std::string ChunkHeader(const std::string& key,
                          absl::Span<const int64_t> shape, int64_t offset,
                          int64_t elements) const;
  void Append(const std::string& header, absl::Span<const float> part,
              const std::shared_ptr<const void>& owner);

  const std::string head_;
  const int chunks_field_;
  const int64_t max_bytes_;
  std::vector<grpc::Slice> slices_;
  int num_chunks_ = 0;
  int64_t bytes_ = 0;
};

// Reassembles tensors from the chunks of a stream of bulk messages, copying
// each chunk's payload once, from gRPC's buffer straight to where the caller
// wants the tensor. A tensor's chunks must arrive in order and back to back,
// within one message or across consecutive ones.
//
// Everything that arrives is validated: INVALID_ARGUMENT names what is wrong
// ("malformed message: ..." for bytes protobuf would not parse; then a chunk
// key of 0 or more than kMaxKeyBytes bytes, a bad shape, a payload that is not
// 1-D float32 of the declared size, a chunk out of order, past the end, or of
// another tensor while one is incomplete, a non-finite value). A message is
// parsed whole before any callback runs, so bytes protobuf would refuse never
// reach the destination; a later error in a message that parses may come
// after earlier tensors of it were completed. After an error the reader and
// the destination of the tensor being read are unspecified; start over with
// a new reader.
class TensorReader {
 public:
  // Called at a tensor's first chunk with its key, shape and element count
  // (at most kMaxTensorElements: the count the sender declares, so check the
  // key and shape before reserving room for it): returns where its values go
  // (room for `elements` floats), or an error that ends the read (an unknown
  // key, a key or shape this side does not accept).
  using Destination = std::function<absl::StatusOr<float*>(
      const std::string& key, absl::Span<const int64_t> shape,
      int64_t elements)>;
  // Called once a tensor's last chunk was written; an error ends the read.
  using Complete = std::function<absl::Status(const std::string& key)>;

  TensorReader(Destination destination, Complete complete);
  ~TensorReader();

  // Reads one message whose field `chunks_field` is repeated TensorChunk; its
  // other fields are parsed into `head` (which is cleared first). With
  // `check_head`, the head is checked once it is parsed, before any chunk
  // reaches the callbacks, and an error from it ends the read.
  absl::Status Read(const grpc::ByteBuffer& message, int chunks_field,
                    google::protobuf::MessageLite* head,
                    const std::function<absl::Status()>& check_head = nullptr);

  // True while a tensor is partly received.
  bool pending() const { return !key_.empty(); }
  // The shape of the tensor being received, or of the last one completed.
  absl::Span<const int64_t> shape() const { return shape_; }

 private:
  struct Chunk;

  // Parses a TensorChunk whose tag was just read; false if protobuf would
  // not parse it.
  static bool ParseChunk(google::protobuf::io::CodedInputStream* in,
                         Chunk* c);
  // Checks a parsed chunk and copies its payload from `data` (a stream over
  // the same message, before the payload) into its tensor.
  absl::Status Deliver(const Chunk& c,
                       google::protobuf::io::CodedInputStream* data);

  Destination destination_;
  Complete complete_;
  // The tensor being received.
  std::string key_;
  std::vector<int64_t> shape_;
  float* values_ = nullptr;
  int64_t total_ = 0;
  int64_t received_ = 0;
  // The chunks of the message being read, as its first pass parsed them
  // (kept across messages so their storage is reused).
  std::vector<Chunk> chunks_;
};

}  // namespace bnps::proto

#endif  // BNPS_PROTO_TENSOR_WIRE_H_
