// The framing of BN messages on the raw-TCP BN connection (bnps.proto,
// BnHello): each message is a 4-byte little-endian length, then that many
// bytes of a serialized protobuf message. A length above kMaxMessageBytes is
// not a frame.
//
// Thread-safety: plain functions; a FrameReader belongs to one reader.

#ifndef BNPS_PROTO_BN_FRAME_H_
#define BNPS_PROTO_BN_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"

namespace bnps::proto {

inline constexpr size_t kFrameHeaderBytes = 4;

// Appends `m` as one frame to `out`. INVALID_ARGUMENT if it is larger than
// kMaxMessageBytes.
absl::Status AppendFrame(const google::protobuf::MessageLite& m,
                         std::string* out);

// Collects bytes as they arrive and cuts them into frames.
class FrameReader {
 public:
  // Appends bytes read from the connection.
  void Append(const char* data, size_t n) { buffer_.append(data, n); }
  // The next whole frame's payload, valid until the next call of Next or
  // Append; nullopt if the bytes so far end inside a frame; INVALID_ARGUMENT
  // for a length above kMaxMessageBytes (the connection is not ours).
  absl::StatusOr<std::optional<absl::string_view>> Next();
  // Bytes held that are not yet returned.
  size_t buffered() const { return buffer_.size() - consumed_; }

 private:
  std::string buffer_;
  size_t consumed_ = 0;  // bytes of buffer_ already returned
};

}  // namespace bnps::proto

#endif  // BNPS_PROTO_BN_FRAME_H_
