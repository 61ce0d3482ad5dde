// A straightforward double-precision batch norm, written from the textbook
// formulas with no attention to speed: the yardstick the kernels are tested
// against. Test-only.
//
// Thread-safety: plain functions.

#ifndef BNPS_BN_REFERENCE_H_
#define BNPS_BN_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "bn/shape.h"

namespace bnps::bn::reference {

// Per-channel statistics over all N*H*W samples of each channel.
struct Stats {
  int64_t count = 0;
  std::vector<double> mean;
  std::vector<double> var;  // biased: sum((x - mean)^2) / count
  std::vector<double> m2;   // sum((x - mean)^2)
};

// Two passes in long double.
Stats ComputeStats(const std::vector<float>& x, const Shape& shape);

// y = gamma * (x - mean) / sqrt(var + eps) + beta, in double.
std::vector<double> Normalize(const std::vector<float>& x, const Shape& shape,
                              const std::vector<double>& mean,
                              const std::vector<double>& var,
                              const std::vector<float>& gamma,
                              const std::vector<float>& beta, double eps);

// Gradients of training-mode BN over the whole batch (statistics from x itself).
struct Gradients {
  std::vector<double> dx;
  std::vector<double> dgamma;
  std::vector<double> dbeta;
};
Gradients Backward(const std::vector<float>& dy, const std::vector<float>& x,
                   const Shape& shape, const std::vector<float>& gamma,
                   double eps);

// The samples of channel `c` of x, in tensor order.
std::vector<double> Channel(const std::vector<float>& x, const Shape& shape,
                            int64_t c);

// Test-data helpers.
// Normal(mean, std) values, per channel mean offset by channel * mean_step.
std::vector<float> RandomTensor(const Shape& shape, double mean, double std,
                                uint64_t seed, double mean_step = 0.0);
std::vector<float> RandomVector(int64_t size, double lo, double hi,
                                uint64_t seed);

// max_i |got_i - want_i| / max(max_i |want_i|, floor): the error relative to the
// scale of the reference.
double MaxRelativeError(const std::vector<double>& got,
                        const std::vector<double>& want, double floor = 1e-12);
double MaxRelativeError(const std::vector<float>& got,
                        const std::vector<double>& want, double floor = 1e-12);

// Rows [begin, end) of an NCHW tensor along N, and the matching shape.
std::vector<float> SliceBatch(const std::vector<float>& x, const Shape& shape,
                              int64_t begin, int64_t end);

}  // namespace bnps::bn::reference

#endif  // BNPS_BN_REFERENCE_H_
