// BN kernels on the CPU: the reference implementation the CUDA kernels are
// tested against, and the backend of workers without a GPU.
//
// Reductions work a (n, c) plane at a time: the plane's mean in double, then its
// squared deviations from that mean, then a Chan merge into the channel. The
// elementwise kernels subtract the mean as a float pair (hi + lo), which keeps
// float32 arithmetic accurate when |mean| >> std.
//
// Thread-safety: stateless; one instance may be shared.

#ifndef BNPS_BN_CPU_KERNELS_H_
#define BNPS_BN_CPU_KERNELS_H_

#include <memory>

#include "bn/kernels.h"

namespace bnps::bn {

std::unique_ptr<BnKernels> NewCpuBnKernels();

}  // namespace bnps::bn

#endif  // BNPS_BN_CPU_KERNELS_H_
