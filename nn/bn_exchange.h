// How a batch-norm layer gets the statistics it normalizes with while
// training: the seam between a layer and a policy.
//
// A BatchNorm layer computes its local moments, hands them to Forward, and
// normalizes with what comes back; in the backward pass it hands its local
// sums (sum dy, sum dy * x_hat) to Backward and computes dx from what comes
// back, with the count of the moments Forward returned (see bn/kernels.h):
//
//   local  Forward returns the local moments, Backward the local sums.
//   sync   both return the merge over all workers (the training loop backs
//          this with the servers; tests back it with in-process merges).
//   async  Forward returns merge(local, others' recent moments), Backward the
//          local sums: the others' moments are constants.
//
// Layers call Forward in model order and Backward in reverse model order, the
// same on every worker, once per layer per step; the caller of the model tells
// the BnExchange which step it is in.
//
// Thread-safety: implementations say; a model uses one from one thread.

#ifndef BNPS_NN_BN_EXCHANGE_H_
#define BNPS_NN_BN_EXCHANGE_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "bn/kernels.h"
#include "bn/moments.h"

namespace bnps::nn {

// A backward exchange under way (BnExchange::StartBackward).
class PendingBackward {
 public:
  // Waits for the exchange if Wait was not called.
  virtual ~PendingBackward() = default;
  // What Backward would have returned. Call once.
  virtual absl::StatusOr<bn::BackwardSums> Wait() = 0;
};

// A PendingBackward that is done already.
class DoneBackward final : public PendingBackward {
 public:
  explicit DoneBackward(absl::StatusOr<bn::BackwardSums> result)
      : result_(std::move(result)) {}
  absl::StatusOr<bn::BackwardSums> Wait() override {
    return std::move(result_);
  }

 private:
  absl::StatusOr<bn::BackwardSums> result_;
};

class BnExchange {
 public:
  virtual ~BnExchange() = default;

  // The moments to normalize with; their count is the count of the
  // backward. The layer updates its running stats from them.
  virtual absl::StatusOr<bn::Moments> Forward(const std::string& layer,
                                              const bn::Moments& local) = 0;
  virtual absl::StatusOr<bn::BackwardSums> Backward(
      const std::string& layer, const bn::BackwardSums& local) = 0;
  // Backward, started: the layer computes what does not depend on the
  // result while the exchange is in flight, then waits. In place of a
  // Backward call, in the same order. The default runs Backward at once.
  virtual std::unique_ptr<PendingBackward> StartBackward(
      const std::string& layer, const bn::BackwardSums& local) {
    return std::make_unique<DoneBackward>(Backward(layer, local));
  }
};

// Local BN: what every worker does without synchronization.
class LocalBnExchange : public BnExchange {
 public:
  absl::StatusOr<bn::Moments> Forward(const std::string& layer,
                                      const bn::Moments& local) override {
    return local;
  }
  absl::StatusOr<bn::BackwardSums> Backward(
      const std::string& layer, const bn::BackwardSums& local) override {
    return local;
  }
};

}  // namespace bnps::nn

#endif  // BNPS_NN_BN_EXCHANGE_H_
