// The CPU backend of the worker's layers (backend.h): oneDNN for convolutions
// and matrix products, the bn/ CPU kernels for batch norm, and plain loops for
// the cheap elementwise and pooling operations. It is the reference the GPU
// backend is tested against.
//
// Threads: oneDNN and the loops here run on OpenMP threads, whose number is a
// property of the process (OMP_NUM_THREADS, or omp_set_num_threads called by
// the binary at start-up); the backend does not change it.
//
// Thread-safety: thread-compatible (it caches oneDNN primitives per geometry);
// use one per thread.

#ifndef BNPS_NN_CPU_BACKEND_H_
#define BNPS_NN_CPU_BACKEND_H_

#include <memory>

#include "nn/backend.h"

namespace bnps::nn {

std::unique_ptr<Backend> NewCpuBackend();

}  // namespace bnps::nn

#endif  // BNPS_NN_CPU_BACKEND_H_
