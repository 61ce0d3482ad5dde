// Softmax cross-entropy on the host: the last step of the model's forward pass
// and the first of its backward pass.

#ifndef BNPS_NN_LOSS_H_
#define BNPS_NN_LOSS_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace bnps::nn {

struct LossResult {
  double loss_sum = 0;  // sum over the batch of -log softmax(logits)[label]
  int64_t correct = 0;  // examples whose largest logit is their label's
  int64_t n = 0;
};

// logits [n, classes] row-major; labels[i] in [0, classes). Writes
// d loss_sum / d logits = softmax - one_hot into dlogits [n, classes] when it
// is not null. Computed in double with the max subtracted, so large logits do
// not overflow. INVALID_ARGUMENT for n < 0, classes < 1, a label out of range
// or a non-finite logit.
absl::StatusOr<LossResult> SoftmaxCrossEntropy(const float* logits, int64_t n,
                                               int64_t classes,
                                               const int32_t* labels,
                                               float* dlogits);

}  // namespace bnps::nn

#endif  // BNPS_NN_LOSS_H_
