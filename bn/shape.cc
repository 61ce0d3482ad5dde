#include "bn/shape.h"

#include "absl/strings/str_cat.h"

namespace bnps::bn {

std::string Shape::ToString() const {
  return absl::StrCat("[", n, ", ", c, ", ", h, ", ", w, "]");
}

absl::Status ValidateShape(const Shape& shape) {
  if (shape.c < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", shape.ToString(), ": need at least one channel"));
  }
  if (shape.n < 0 || shape.h < 0 || shape.w < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", shape.ToString(), ": negative dimension"));
  }
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  constexpr int64_t kMaxElements = int64_t{1} << 48;
  if (shape.n > kMaxDim || shape.c > kMaxDim || shape.h > kMaxDim ||
      shape.w > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", shape.ToString(), ": dimension too large"));
  }
  const double elements = static_cast<double>(shape.n) * shape.c * shape.h * shape.w;
  if (elements >= static_cast<double>(kMaxElements)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", shape.ToString(), ": too many elements"));
  }
  return absl::OkStatus();
}

}  // namespace bnps::bn
