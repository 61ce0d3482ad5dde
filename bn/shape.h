// Shape of an activation tensor that batch normalization works on.
//
// Tensors are dense float32 in NCHW layout: element (n, c, s) of a tensor with
// S = h * w spatial positions lives at index (n * C + c) * S + s. A 2-D N x C
// tensor (the input of a BN after a linear layer) is {n, c, 1, 1}.
//
// Thread-safety: a plain value type.

#ifndef BNPS_BN_SHAPE_H_
#define BNPS_BN_SHAPE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace bnps::bn {

struct Shape {
  int64_t n = 0;  // batch size; 0 is legal (a worker with no samples)
  int64_t c = 1;  // channels; at least 1
  int64_t h = 1;
  int64_t w = 1;

  // Spatial positions per image and channel (h * w).
  int64_t Spatial() const { return h * w; }
  // Samples per channel: the count the statistics of one channel are over.
  int64_t PerChannel() const { return n * h * w; }
  // Total number of elements.
  int64_t Elements() const { return n * c * h * w; }

  std::string ToString() const;
};

// OK if c >= 1, n, h, w >= 0, and the element count fits comfortably in int64
// (below 2^48). Otherwise INVALID_ARGUMENT naming the bad dimension.
absl::Status ValidateShape(const Shape& shape);

}  // namespace bnps::bn

#endif  // BNPS_BN_SHAPE_H_
