// A generated stand-in for Fashion-MNIST, for tests and demos without the real
// files: a small CNN can learn it in a few steps.
//
// Each class draws a bright bar on a dim noisy background: even classes a
// horizontal bar, odd classes a vertical one, class c in band c / 2 of
// ceil(num_classes / 2) equal bands across the image. Every image varies the
// bar's brightness, knocks out some of its pixels and adds per-pixel noise.
// Labels are balanced: example i has label i % num_classes.
//
// The output depends only on the arguments (the generator is written out here,
// not left to <random>), so a seed names the same dataset everywhere.
//
// Thread-safety: thread-safe (no shared state).

#ifndef BNPS_WORKER_DATA_SYNTHETIC_H_
#define BNPS_WORKER_DATA_SYNTHETIC_H_

#include <cstdint>

#include "worker/data/dataset.h"

namespace bnps::worker {

// REQUIRES: n >= 0, rows >= 1, cols >= 1, 1 <= num_classes <= 256 (values
// outside are clamped into range). Classes have bars of their own only if rows
// and cols are at least ceil(num_classes / 2) (28x28 and 10 classes are
// plenty).
Dataset MakeSyntheticDataset(int64_t n, int64_t rows, int64_t cols,
                             int num_classes, uint64_t seed);

}  // namespace bnps::worker

#endif  // BNPS_WORKER_DATA_SYNTHETIC_H_
