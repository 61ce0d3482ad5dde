#include "proto/bn_frame.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/limits.h"

namespace bnps::proto {
namespace {

constexpr size_t kKeptCapacity = 256 * 1024;

void StoreLength(uint32_t n, char* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((n >> (8 * i)) & 0xff);
}

uint32_t LoadLength(const char* p) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) {
    n |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return n;
}

}  // namespace

absl::Status AppendFrame(const google::protobuf::MessageLite& m,
                         std::string* out) {
  const size_t bytes = m.ByteSizeLong();
  if (bytes > static_cast<size_t>(kMaxMessageBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a BN message of ", bytes, " bytes, more than ",
                     kMaxMessageBytes));
  }
  const size_t start = out->size();
  out->resize(start + kFrameHeaderBytes + bytes);
  StoreLength(static_cast<uint32_t>(bytes), out->data() + start);
  m.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(out->data() + start + kFrameHeaderBytes));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<absl::string_view>> FrameReader::Next() {
  // Drop what earlier calls returned once it is most of the buffer, so the
  // buffer does not grow with the connection's age.
  if (consumed_ > 0 && consumed_ * 2 >= buffer_.size()) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
    // Nor keep the room of a large frame once it is gone: a server holds
    // many readers, and their idle buffers add up.
    if (buffer_.empty() && buffer_.capacity() > kKeptCapacity) {
      buffer_.shrink_to_fit();
    }
  }
  if (buffer_.size() - consumed_ < kFrameHeaderBytes) return std::nullopt;
  const uint32_t n = LoadLength(buffer_.data() + consumed_);
  if (n > static_cast<uint32_t>(kMaxMessageBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a frame of ", n, " bytes, more than ", kMaxMessageBytes));
  }
  if (buffer_.size() - consumed_ < kFrameHeaderBytes + n) return std::nullopt;
  absl::string_view payload(buffer_.data() + consumed_ + kFrameHeaderBytes, n);
  consumed_ += kFrameHeaderBytes + n;
  return payload;
}

}  // namespace bnps::proto
