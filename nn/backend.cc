#include "nn/backend.h"

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

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

namespace {

absl::Status ValidateLinearGeometry(const LinearGeometry& g) {
  if (g.n < 0 || g.in < 1 || g.out < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad linear geometry: n=", g.n, " in=", g.in, " out=", g.out));
  }
  return absl::OkStatus();
}

// Global average pooling, x [n, c, hw] -> y [n, c].
absl::Status ValidateGlobalPoolGeometry(int64_t n, int64_t c, int64_t hw) {
  if (n < 0 || c < 1 || hw < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad global average pooling geometry: n=", n, " c=", c, " hw=", hw));
  }
  return absl::OkStatus();
}

// A tensor argument of an operation, for ValidateTensors.
struct TensorArg {
  const void* data;
  int64_t elements;
  const char* name;
};

// INVALID_ARGUMENT naming the first tensor that is null but holds values.
absl::Status ValidateTensors(std::initializer_list<TensorArg> tensors) {
  for (const TensorArg& t : tensors) {
    if (t.data == nullptr && t.elements > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          t.name, " is null for a tensor of ", t.elements, " values"));
    }
  }
  return absl::OkStatus();
}

// INVALID_ARGUMENT ("<what>: negative element count") if n < 0.
absl::Status ValidateCount(int64_t n, const char* what) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": negative element count ", n));
  }
  return absl::OkStatus();
}

}  // namespace

// ---- Backend: the checks of every operation, then the backend's Do* ---------

absl::StatusOr<Buffer> Backend::Allocate(int64_t n) {
  if (absl::Status s = ValidateCount(n, "Allocate"); !s.ok()) return s;
  if (n == 0) return Buffer();
  if (n > std::numeric_limits<int64_t>::max() /
              static_cast<int64_t>(sizeof(float))) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Allocate of ", n, " floats: too many bytes"));
  }
  return DoAllocate(n);
}

absl::Status Backend::CopyToDevice(const float* host, int64_t n, float* dst) {
  if (absl::Status s = ValidateCount(n, "CopyToDevice"); !s.ok()) return s;
  if (absl::Status s =
          ValidateTensors({{host, n, "source"}, {dst, n, "destination"}});
      !s.ok()) {
    return s;
  }
  if (n == 0) return absl::OkStatus();
  return DoCopyToDevice(host, n, dst);
}

absl::Status Backend::CopyToHost(const float* src, int64_t n, float* host) {
  if (absl::Status s = ValidateCount(n, "CopyToHost"); !s.ok()) return s;
  if (absl::Status s =
          ValidateTensors({{src, n, "source"}, {host, n, "destination"}});
      !s.ok()) {
    return s;
  }
  if (n == 0) return absl::OkStatus();
  return DoCopyToHost(src, n, host);
}

absl::Status Backend::CopyManyToHost(absl::Span<const HostCopy> copies) {
  std::vector<HostCopy> work;
  work.reserve(copies.size());
  for (const HostCopy& c : copies) {
    if (absl::Status s = ValidateCount(c.n, "CopyManyToHost"); !s.ok()) {
      return s;
    }
    if (absl::Status s = ValidateTensors(
            {{c.src, c.n, "source"}, {c.host, c.n, "destination"}});
        !s.ok()) {
      return s;
    }
    if (c.n > 0) work.push_back(c);
  }
  if (work.empty()) return absl::OkStatus();
  return DoCopyManyToHost(work);
}

absl::Status Backend::DoCopyManyToHost(absl::Span<const HostCopy> copies) {
  for (const HostCopy& c : copies) {
    if (absl::Status s = DoCopyToHost(c.src, c.n, c.host); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Backend::Zero(float* dst, int64_t n) {
  if (absl::Status s = ValidateCount(n, "Zero"); !s.ok()) return s;
  if (absl::Status s = ValidateTensors({{dst, n, "dst"}}); !s.ok()) return s;
  if (n == 0) return absl::OkStatus();
  return DoZero(dst, n);
}

absl::Status Backend::ConvForward(const ConvGeometry& g, const float* x,
                                  const float* w, float* y) {
  if (absl::Status s = ValidateConvGeometry(g); !s.ok()) return s;
  if (absl::Status s = ValidateTensors({{x, g.input_elements(), "x"},
                                        {w, g.weight_elements(), "w"},
                                        {y, g.output_elements(), "y"}});
      !s.ok()) {
    return s;
  }
  if (g.n == 0) return absl::OkStatus();
  return DoConvForward(g, x, w, y);
}

absl::Status Backend::ConvBackwardData(const ConvGeometry& g, const float* dy,
                                       const float* w, float* dx) {
  if (absl::Status s = ValidateConvGeometry(g); !s.ok()) return s;
  if (absl::Status s = ValidateTensors({{dy, g.output_elements(), "dy"},
                                        {w, g.weight_elements(), "w"},
                                        {dx, g.input_elements(), "dx"}});
      !s.ok()) {
    return s;
  }
  if (g.n == 0) return absl::OkStatus();
  return DoConvBackwardData(g, dy, w, dx);
}

absl::Status Backend::ConvBackwardWeights(const ConvGeometry& g, const float* x,
                                          const float* dy, float* dw) {
  if (absl::Status s = ValidateConvGeometry(g); !s.ok()) return s;
  if (absl::Status s = ValidateTensors({{x, g.input_elements(), "x"},
                                        {dy, g.output_elements(), "dy"},
                                        {dw, g.weight_elements(), "dw"}});
      !s.ok()) {
    return s;
  }
  if (g.n == 0) return absl::OkStatus();
  return DoConvBackwardWeights(g, x, dy, dw);
}

absl::Status Backend::LinearForward(const LinearGeometry& g, const float* x,
                                    const float* w, const float* b, float* y) {
  if (absl::Status s = ValidateLinearGeometry(g); !s.ok()) return s;
  if (absl::Status s = ValidateTensors({{x, g.n * g.in, "x"},
                                        {w, g.out * g.in, "w"},
                                        {b, g.out, "b"},
                                        {y, g.n * g.out, "y"}});
      !s.ok()) {
    return s;
  }
  if (g.n == 0) return absl::OkStatus();
  return DoLinearForward(g, x, w, b, y);
}

absl::Status Backend::LinearBackward(const LinearGeometry& g, const float* dy,
                                     const float* x, const float* w, float* dx,
                                     float* dw, float* db) {
  if (absl::Status s = ValidateLinearGeometry(g); !s.ok()) return s;
  // dx may be null (not wanted); w is checked even then, as for every other
  // non-empty tensor.
  if (absl::Status s = ValidateTensors({{dy, g.n * g.out, "dy"},
                                        {x, g.n * g.in, "x"},
                                        {w, g.out * g.in, "w"},
                                        {dw, g.out * g.in, "dw"},
                                        {db, g.out, "db"}});
      !s.ok()) {
    return s;
  }
  if (g.n == 0) return absl::OkStatus();
  return DoLinearBackward(g, dy, x, w, dx, dw, db);
}

absl::Status Backend::ReluForward(int64_t n, const float* x, float* y) {
  if (absl::Status s = ValidateCount(n, "ReluForward"); !s.ok()) return s;
  if (absl::Status s = ValidateTensors({{x, n, "x"}, {y, n, "y"}}); !s.ok()) {
    return s;
  }
  if (n == 0) return absl::OkStatus();
  return DoReluForward(n, x, y);
}

absl::Status Backend::ReluBackward(int64_t n, const float* dy, const float* y,
                                   float* dx) {
  if (absl::Status s = ValidateCount(n, "ReluBackward"); !s.ok()) return s;
  if (absl::Status s =
          ValidateTensors({{dy, n, "dy"}, {y, n, "y"}, {dx, n, "dx"}});
      !s.ok()) {
    return s;
  }
  if (n == 0) return absl::OkStatus();
  return DoReluBackward(n, dy, y, dx);
}

absl::Status Backend::MaxPoolForward(const PoolGeometry& g, const float* x,
                                     float* y) {
  if (absl::Status s = ValidatePoolGeometry(g); !s.ok()) return s;
  if (absl::Status s = ValidateTensors(
          {{x, g.input_elements(), "x"}, {y, g.output_elements(), "y"}});
      !s.ok()) {
    return s;
  }
  if (g.n == 0) return absl::OkStatus();
  return DoMaxPoolForward(g, x, y);
}

absl::Status Backend::MaxPoolBackward(const PoolGeometry& g, const float* x,
                                      const float* dy, float* dx) {
  if (absl::Status s = ValidatePoolGeometry(g); !s.ok()) return s;
  if (absl::Status s = ValidateTensors({{x, g.input_elements(), "x"},
                                        {dy, g.output_elements(), "dy"},
                                        {dx, g.input_elements(), "dx"}});
      !s.ok()) {
    return s;
  }
  if (g.n == 0) return absl::OkStatus();
  return DoMaxPoolBackward(g, x, dy, dx);
}

absl::Status Backend::GlobalAvgPoolForward(int64_t n, int64_t c, int64_t hw,
                                           const float* x, float* y) {
  if (absl::Status s = ValidateGlobalPoolGeometry(n, c, hw); !s.ok()) return s;
  if (absl::Status s = ValidateTensors({{x, n * c * hw, "x"}, {y, n * c, "y"}});
      !s.ok()) {
    return s;
  }
  if (n == 0) return absl::OkStatus();
  return DoGlobalAvgPoolForward(n, c, hw, x, y);
}

absl::Status Backend::GlobalAvgPoolBackward(int64_t n, int64_t c, int64_t hw,
                                            const float* dy, float* dx) {
  if (absl::Status s = ValidateGlobalPoolGeometry(n, c, hw); !s.ok()) return s;
  if (absl::Status s =
          ValidateTensors({{dy, n * c, "dy"}, {dx, n * c * hw, "dx"}});
      !s.ok()) {
    return s;
  }
  if (n == 0) return absl::OkStatus();
  return DoGlobalAvgPoolBackward(n, c, hw, dy, dx);
}

absl::Status Backend::Add(int64_t n, const float* a, const float* b, float* y) {
  if (absl::Status s = ValidateCount(n, "Add"); !s.ok()) return s;
  if (absl::Status s = ValidateTensors({{a, n, "a"}, {b, n, "b"}, {y, n, "y"}});
      !s.ok()) {
    return s;
  }
  if (n == 0) return absl::OkStatus();
  return DoAdd(n, a, b, y);
}

// ---- Buffer -----------------------------------------------------------------

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
