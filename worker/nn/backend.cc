#include "worker/nn/backend.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace bnps::nn {

absl::Status ValidateConvGeometry(const ConvGeometry& g) {
  if (g.n < 0 || g.in_channels < 1 || g.height < 1 || g.width < 1 ||
      g.out_channels < 1 || g.kernel < 1 || g.stride < 1 || g.pad < 0 ||
      g.pad >= g.kernel || g.height + 2 * g.pad < g.kernel ||
      g.width + 2 * g.pad < g.kernel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad convolution geometry: n=", g.n, " in_channels=", g.in_channels,
        " height=", g.height, " width=", g.width,
        " out_channels=", g.out_channels, " kernel=", g.kernel,
        " stride=", g.stride, " pad=", g.pad));
  }
  return absl::OkStatus();
}

absl::Status ValidatePoolGeometry(const PoolGeometry& g) {
  if (g.n < 0 || g.channels < 1 || g.height < 1 || g.width < 1 ||
      g.kernel < 1 || g.stride < 1 || g.kernel > g.height ||
      g.kernel > g.width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad pooling geometry: n=", g.n, " channels=", g.channels,
        " height=", g.height, " width=", g.width, " kernel=", g.kernel,
        " stride=", g.stride));
  }
  return absl::OkStatus();
}

absl::Status ValidateLinearGeometry(const LinearGeometry& g) {
  if (g.n < 0 || g.in < 1 || g.out < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad linear geometry: n=", g.n, " in=", g.in, " out=", g.out));
  }
  return absl::OkStatus();
}

absl::Status ValidateGlobalPoolGeometry(int64_t n, int64_t c, int64_t hw) {
  if (n < 0 || c < 1 || hw < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad global average pooling geometry: n=", n, " c=", c, " hw=", hw));
  }
  return absl::OkStatus();
}

absl::Status ValidateTensors(std::initializer_list<TensorArg> tensors) {
  for (const TensorArg& t : tensors) {
    if (t.data == nullptr && t.elements > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          t.name, " is null for a tensor of ", t.elements, " values"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateCount(int64_t n, const char* what) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": negative element count ", n));
  }
  return absl::OkStatus();
}

Buffer::Buffer(Buffer&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Buffer::~Buffer() { Release(); }

void Buffer::Release() {
  if (backend_ != nullptr && data_ != nullptr) backend_->Free(data_);
  backend_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace bnps::nn
