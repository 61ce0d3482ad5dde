// Fuzzes proto/tensor_wire's reader with arbitrary bytes as a push message
// (PushGradientsRequest, as the server reads it) and as a pull answer
// (PullParametersResponse, as the client reads it), one or two messages per
// input. Whatever the reader accepts, protobuf's generated parser must accept
// too: a message the reader takes but protobuf refuses aborts the run.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/bnps.pb.h"
#include "proto/tensor_wire.h"

namespace {

// Tensors larger than this many floats are refused, as a server refuses a
// shape it does not hold.
constexpr int64_t kMaxFloats = 1 << 16;

grpc::ByteBuffer Buffer(const uint8_t* data, size_t size) {
  grpc::Slice slice(data, size);
  return grpc::ByteBuffer(&slice, 1);
}

// Reads `messages` in order with one reader; true if all were accepted.
bool ReadAll(const std::vector<std::string>& messages, int chunks_field,
             google::protobuf::MessageLite* head) {
  std::vector<float> storage;
  bnps::proto::TensorReader reader(
      [&storage](const std::string&, absl::Span<const int64_t>,
                 int64_t n) -> absl::StatusOr<float*> {
        if (n > kMaxFloats) return absl::InvalidArgumentError("too large");
        storage.assign(n, 0.0f);
        return storage.data();
      },
      [](const std::string&) { return absl::OkStatus(); });
  for (const std::string& m : messages) {
    grpc::ByteBuffer buffer =
        Buffer(reinterpret_cast<const uint8_t*>(m.data()), m.size());
    if (!reader.Read(buffer, chunks_field, head).ok()) return false;
  }
  return true;
}

template <typename Message>
void Check(const std::vector<std::string>& messages, int chunks_field) {
  Message head;
  if (!ReadAll(messages, chunks_field, &head)) return;
  for (const std::string& m : messages) {
    Message parsed;
    if (!parsed.ParseFromString(m)) {
      std::fprintf(stderr,
                   "tensor_wire accepted a message protobuf refuses (%zu "
                   "bytes)\n",
                   m.size());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first two bytes (little-endian) are where the rest splits into two
  // messages; past its end, the rest is one message.
  std::vector<std::string> messages;
  if (size < 2) {
    messages.emplace_back();
  } else {
    const size_t rest = size - 2;
    const size_t cut = std::min<size_t>(rest, data[0] | (data[1] << 8));
    messages.emplace_back(reinterpret_cast<const char*>(data + 2), cut);
    if (cut < rest) {
      messages.emplace_back(reinterpret_cast<const char*>(data + 2 + cut),
                            rest - cut);
    }
  }
  Check<bnps::proto::PushGradientsRequest>(
      messages, bnps::proto::PushGradientsRequest::kChunksFieldNumber);
  Check<bnps::proto::PullParametersResponse>(
      messages, bnps::proto::PullParametersResponse::kChunksFieldNumber);
  return 0;
}
