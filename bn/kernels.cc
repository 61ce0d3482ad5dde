#include "bn/kernels.h"

#include <cmath>

#include "absl/base/macros.h"
#include "absl/strings/str_cat.h"

namespace bnps::bn {

BackwardSums BackwardSums::Zero(int64_t channels) {
  BackwardSums sums;
  sums.sum_dy.assign(channels, 0.0);
  sums.sum_dy_xhat.assign(channels, 0.0);
  return sums;
}

absl::Status AddSums(const BackwardSums& part, BackwardSums* acc) {
  if (part.sum_dy.size() != acc->sum_dy.size() ||
      part.sum_dy_xhat.size() != acc->sum_dy_xhat.size() ||
      part.sum_dy.size() != part.sum_dy_xhat.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backward sums: part has ", part.sum_dy.size(), "/",
        part.sum_dy_xhat.size(), " channels, accumulator has ",
        acc->sum_dy.size(), "/", acc->sum_dy_xhat.size()));
  }
  AccumulateSums(part, acc);
  return absl::OkStatus();
}

void AccumulateSums(const BackwardSums& part, BackwardSums* acc) {
  ABSL_ASSERT(part.sum_dy.size() == acc->sum_dy.size() &&
              part.sum_dy_xhat.size() == acc->sum_dy_xhat.size() &&
              part.sum_dy.size() == part.sum_dy_xhat.size());
  for (size_t c = 0; c < part.sum_dy.size(); ++c) {
    acc->sum_dy[c] += part.sum_dy[c];
    acc->sum_dy_xhat[c] += part.sum_dy_xhat[c];
  }
}

absl::StatusOr<InputGradientMap> InputGradient(absl::Span<const double> mean,
                                               absl::Span<const double> var,
                                               absl::Span<const double> gamma,
                                               double eps,
                                               const BackwardSums& sums,
                                               int64_t count) {
  const size_t c = mean.size();
  if (var.size() != c || (!gamma.empty() && gamma.size() != c) ||
      sums.sum_dy.size() != c || sums.sum_dy_xhat.size() != c) {
    return absl::InvalidArgumentError(absl::StrCat(
        "per-channel sizes differ: mean ", c, ", var ", var.size(),
        ", gamma ", gamma.size(), ", sums ", sums.sum_dy.size(), " and ",
        sums.sum_dy_xhat.size()));
  }
  if (count < 1 || !(eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "count ", count, " and eps ", eps, ": want count >= 1 and eps > 0"));
  }
  // dx = gamma * inv * (dy - sum_dy / n - x_hat * sum_dy_xhat / n) with
  // x_hat = (x - mean) * inv.
  InputGradientMap m{std::vector<double>(c), std::vector<double>(c),
                     std::vector<double>(c)};
  const double n = static_cast<double>(count);
  for (size_t i = 0; i < c; ++i) {
    const double inv = 1.0 / std::sqrt(var[i] + eps);
    m.k1[i] = gamma.empty() ? inv : inv * gamma[i];
    m.k2[i] = -m.k1[i] * inv * sums.sum_dy_xhat[i] / n;
    m.k3[i] = -m.k1[i] * sums.sum_dy[i] / n - m.k2[i] * mean[i];
  }
  return m;
}

absl::Status ValidateNormalization(const Shape& shape, const Normalization& norm,
                                   bool need_beta) {
  if (absl::Status s = ValidateShape(shape); !s.ok()) return s;
  const size_t c = static_cast<size_t>(shape.c);
  if (norm.mean.size() != c || norm.var.size() != c || norm.gamma.size() != c ||
      (need_beta && norm.beta.size() != c)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "normalization for ", c, " channels has mean ", norm.mean.size(),
        ", var ", norm.var.size(), ", gamma ", norm.gamma.size(), ", beta ",
        norm.beta.size()));
  }
  if (!(norm.eps > 0) || !std::isfinite(norm.eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eps must be positive and finite, got ", norm.eps));
  }
  for (size_t i = 0; i < c; ++i) {
    if (!std::isfinite(norm.mean[i]) || !std::isfinite(norm.var[i]) ||
        norm.var[i] < 0 || !std::isfinite(norm.gamma[i]) ||
        (need_beta && !std::isfinite(norm.beta[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "normalization: channel ", i,
          " has a non-finite value or a negative variance"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTensor(const float* p, const Shape& shape, const char* what) {
  if (p == nullptr && shape.Elements() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is null for a tensor of shape ", shape.ToString()));
  }
  return absl::OkStatus();
}

absl::Status ValidateBackwardSums(const Shape& shape, const BackwardSums& sums,
                                  int64_t count) {
  const size_t c = static_cast<size_t>(shape.c);
  if (sums.sum_dy.size() != c || sums.sum_dy_xhat.size() != c) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backward sums have ", sums.sum_dy.size(), "/", sums.sum_dy_xhat.size(),
        " channels, tensor has ", c));
  }
  if (count < shape.PerChannel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "count ", count, " is smaller than the local samples per channel ",
        shape.PerChannel()));
  }
  return absl::OkStatus();
}

absl::Status ValidateMomentsArgs(const float* x, const Shape& shape) {
  if (absl::Status s = ValidateShape(shape); !s.ok()) return s;
  return ValidateTensor(x, shape, "x");
}

absl::Status ValidateNormalizeArgs(const float* x, const Shape& shape,
                                   const Normalization& norm, const float* y) {
  if (absl::Status s = ValidateNormalization(shape, norm, /*need_beta=*/true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateTensor(x, shape, "x"); !s.ok()) return s;
  return ValidateTensor(y, shape, "y");
}

absl::Status ValidateBackwardReduceArgs(const float* dy, const float* x,
                                        const Shape& shape,
                                        const Normalization& norm) {
  if (absl::Status s = ValidateNormalization(shape, norm, /*need_beta=*/false);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateTensor(dy, shape, "dy"); !s.ok()) return s;
  return ValidateTensor(x, shape, "x");
}

absl::Status ValidateBackwardInputArgs(const float* dy, const float* x,
                                       const Shape& shape,
                                       const Normalization& norm,
                                       const BackwardSums& sums, int64_t count,
                                       const float* dx) {
  if (absl::Status s = ValidateBackwardReduceArgs(dy, x, shape, norm);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateTensor(dx, shape, "dx"); !s.ok()) return s;
  return ValidateBackwardSums(shape, sums, count);
}

}  // namespace bnps::bn
