#include "proto/codec.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "util/finite.h"
#include "proto/limits.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "bnps sends tensors as little-endian bytes with memcpy");

namespace bnps::proto {
namespace {

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

template <typename T>
absl::Status CheckFinite(const std::vector<T>& v) {
  if (const size_t i = util::FirstNonFinite(absl::MakeConstSpan(v));
      i < v.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor element ", i, " is not finite (", v[i], ")"));
  }
  return absl::OkStatus();
}

// The element count of a tensor of `dtype`, `shape` and `bytes` bytes;
// INVALID_ARGUMENT unless it is `want` (of `element_size` bytes) and `bytes`
// holds exactly product(shape) elements.
absl::StatusOr<int64_t> CheckLayout(int dtype, DType want,
                                    absl::Span<const int64_t> shape,
                                    int64_t bytes, size_t element_size) {
  if (dtype != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor dtype is ", DType_Name(static_cast<DType>(dtype)),
                     ", expected ", DType_Name(want)));
  }
  absl::StatusOr<int64_t> n = NumElements(shape);
  if (!n.ok()) return n.status();
  if (bytes != *n * static_cast<int64_t>(element_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor of shape ", ShapeString(shape), " needs ",
                     *n * element_size, " bytes, got ", bytes));
  }
  return n;
}

// The values of a per-channel float64 tensor [want_size] (any size if
// want_size < 0), copied out of `t` once its layout is checked; not yet
// checked for finiteness.
absl::StatusOr<std::vector<double>> TakeChannels(const Tensor& t,
                                                 int64_t want_size) {
  const absl::Span<const int64_t> shape(t.shape().data(), t.shape_size());
  if (shape.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "per-channel tensor must be 1-D, got shape ", ShapeString(shape)));
  }
  if (want_size >= 0 && shape[0] != want_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "per-channel tensor has ", shape[0], " channels, expected ", want_size));
  }
  if (shape[0] > kMaxChannels) {
    return absl::InvalidArgumentError(
        absl::StrCat("per-channel tensor has more than ", kMaxChannels, " channels"));
  }
  absl::StatusOr<int64_t> n =
      CheckLayout(t.dtype(), DTYPE_FLOAT64, shape,
                  static_cast<int64_t>(t.data().size()), sizeof(double));
  if (!n.ok()) return n.status();
  std::vector<double> values(*n);
  if (*n > 0) std::memcpy(values.data(), t.data().data(), t.data().size());
  return values;
}

// TakeChannels, and every value finite.
absl::StatusOr<std::vector<double>> TakeFinite(const Tensor& t,
                                               int64_t want_size) {
  absl::StatusOr<std::vector<double>> out = TakeChannels(t, want_size);
  if (!out.ok()) return out.status();
  if (absl::Status s = CheckFinite(*out); !s.ok()) return s;
  return out;
}

}  // namespace

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension in shape ", ShapeString(shape)));
    }
    if (d > 0 && n > kMaxTensorElements / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ShapeString(shape), " exceeds ", kMaxTensorElements,
          " elements"));
    }
    n *= d;
  }
  return n;
}

void EncodeFloat32(absl::Span<const float> values,
                   absl::Span<const int64_t> shape, Tensor* out) {
  out->set_dtype(DTYPE_FLOAT32);
  out->mutable_shape()->Assign(shape.begin(), shape.end());
  out->set_data(reinterpret_cast<const char*>(values.data()),
                values.size() * sizeof(float));
}

void EncodeFloat64(absl::Span<const double> values, Tensor* out) {
  out->set_dtype(DTYPE_FLOAT64);
  out->clear_shape();
  out->add_shape(static_cast<int64_t>(values.size()));
  out->set_data(reinterpret_cast<const char*>(values.data()),
                values.size() * sizeof(double));
}

absl::StatusOr<std::vector<float>> DecodeFloat32(
    const Tensor& t, absl::Span<const int64_t> want_shape) {
  if (!want_shape.empty() &&
      !std::equal(want_shape.begin(), want_shape.end(), t.shape().begin(),
                  t.shape().end())) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor has shape ", ShapeString(t.shape()),
                     ", expected ", ShapeString(want_shape)));
  }
  absl::StatusOr<int64_t> n =
      CheckLayout(t.dtype(), DTYPE_FLOAT32, t.shape(),
                  static_cast<int64_t>(t.data().size()), sizeof(float));
  if (!n.ok()) return n.status();
  std::vector<float> out(*n);
  if (*n > 0) std::memcpy(out.data(), t.data().data(), t.data().size());
  if (absl::Status s = CheckFinite(out); !s.ok()) return s;
  return out;
}

void EncodeMoments(const bn::Moments& m, BnMoments* out) {
  out->set_count(m.count);
  EncodeFloat64(m.mean, out->mutable_mean());
  EncodeFloat64(m.m2, out->mutable_m2());
}

absl::StatusOr<bn::Moments> DecodeMoments(const BnMoments& m, int64_t channels) {
  bn::Moments out;
  out.count = m.count();
  // ValidateMoments checks the values (finite, M2 not negative) in one pass
  // per array and names the channel, so the decode does not check them first.
  absl::StatusOr<std::vector<double>> mean = TakeChannels(m.mean(), channels);
  if (!mean.ok()) return mean.status();
  absl::StatusOr<std::vector<double>> m2 = TakeChannels(m.m2(), mean->size());
  if (!m2.ok()) return m2.status();
  out.mean = *std::move(mean);
  out.m2 = *std::move(m2);
  if (absl::Status s = bn::ValidateMoments(out); !s.ok()) return s;
  return out;
}

void EncodeSums(const bn::BackwardSums& s, BnSums* out) {
  EncodeFloat64(s.sum_dy, out->mutable_sum_dy());
  EncodeFloat64(s.sum_dy_xhat, out->mutable_sum_dy_xhat());
}

absl::StatusOr<bn::BackwardSums> DecodeSums(const BnSums& s, int64_t channels) {
  // Not checked for finite values: bn::BackwardSums says why.
  absl::StatusOr<std::vector<double>> dy = TakeChannels(s.sum_dy(), channels);
  if (!dy.ok()) return dy.status();
  absl::StatusOr<std::vector<double>> dyx = TakeChannels(s.sum_dy_xhat(), dy->size());
  if (!dyx.ok()) return dyx.status();
  if (dy->empty()) return absl::InvalidArgumentError("backward sums are empty");
  return bn::BackwardSums{*std::move(dy), *std::move(dyx)};
}

void EncodeRunning(const bn::RunningStats& r, BnRunningStats* out) {
  EncodeFloat64(r.mean, out->mutable_mean());
  EncodeFloat64(r.var, out->mutable_var());
}

absl::StatusOr<bn::RunningStats> DecodeRunning(const BnRunningStats& r,
                                               int64_t channels) {
  absl::StatusOr<std::vector<double>> mean = TakeFinite(r.mean(), channels);
  if (!mean.ok()) return mean.status();
  absl::StatusOr<std::vector<double>> var = TakeChannels(r.var(), mean->size());
  if (!var.ok()) return var.status();
  if (mean->empty()) return absl::InvalidArgumentError("running stats are empty");
  // One scan: a variance must be finite and not negative.
  if (const size_t i = util::FirstNotFiniteNonNegative(*var); i < var->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("running variance of channel ", i, " is ", (*var)[i],
                     "; need a finite value >= 0"));
  }
  return bn::RunningStats{*std::move(mean), *std::move(var)};
}

void AppendChunks(const std::string& key, absl::Span<const int64_t> shape,
                  absl::Span<const float> values, int64_t chunk_floats,
                  google::protobuf::RepeatedPtrField<TensorChunk>* out) {
  const int64_t n = static_cast<int64_t>(values.size());
  int64_t offset = 0;
  do {  // an empty tensor still travels as one empty chunk
    const int64_t len = std::min(chunk_floats, n - offset);
    TensorChunk* chunk = out->Add();
    chunk->set_key(key);
    chunk->mutable_shape()->Assign(shape.begin(), shape.end());
    chunk->set_offset(offset);
    const int64_t part_shape[] = {len};
    EncodeFloat32(values.subspan(offset, len), part_shape, chunk->mutable_part());
    offset += len;
  } while (offset < n);
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

int WireCode(const absl::Status& s) { return static_cast<int>(s.code()); }

absl::Status StatusFromWire(int code, absl::string_view message,
                            absl::string_view context) {
  if (code == 0) return absl::OkStatus();
  const std::string lead =
      context.empty() ? std::string() : absl::StrCat(context, ": ");
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(
        absl::StrCat(lead, "code ", code, ": ", message));
  }
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat(lead, message));
}

}  // namespace bnps::proto
