#include "nn/loss.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace bnps::nn {

absl::StatusOr<LossResult> SoftmaxCrossEntropy(const float* logits, int64_t n,
                                               int64_t classes,
                                               const int32_t* labels,
                                               float* dlogits) {
  if (n < 0 || classes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad loss geometry: n=", n, " classes=", classes));
  }
  LossResult r;
  r.n = n;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits + i * classes;
    const int32_t label = labels[i];
    if (label < 0 || label >= classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", label, " of example ", i, " is outside [0, ", classes, ")"));
    }
    int64_t best = 0;
    for (int64_t k = 0; k < classes; ++k) {
      if (!std::isfinite(z[k])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "logit ", k, " of example ", i, " is ", z[k],
            " (the model diverged; try a lower learning rate)"));
      }
      if (z[k] > z[best]) best = k;
    }
    double sum = 0;
    for (int64_t k = 0; k < classes; ++k) sum += std::exp(double{z[k]} - z[best]);
    const double log_sum = std::log(sum) + z[best];
    r.loss_sum += log_sum - z[label];
    if (best == label) ++r.correct;
    if (dlogits != nullptr) {
      for (int64_t k = 0; k < classes; ++k) {
        const double p = std::exp(double{z[k]} - log_sum);
        dlogits[i * classes + k] = static_cast<float>(p - (k == label ? 1 : 0));
      }
    }
  }
  return r;
}

}  // namespace bnps::nn
