// What the training-loop tests share (tests/training_test.cc over real
// servers, worker/trainer_test.cc over the in-process client): a small model,
// and the data and the measure of the sync invariant (W workers of batch b
// follow one worker of batch W b), and the check that two runs ended on the
// same bits.

#ifndef BNPS_WORKER_TRAINING_TESTING_H_
#define BNPS_WORKER_TRAINING_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/dataset.h"
#include "nn/model.h"

namespace bnps::test {

// One block of width 4 on 12x12 images: every layer kind, in milliseconds.
inline nn::ModelOptions SmallModel() {
  nn::ModelOptions o;
  o.depth = 1;
  o.width = 4;
  o.image_height = 12;
  o.image_width = 12;
  return o;
}

// The largest |a - b| over the largest |a| (at least 1e-3).
inline double MaxRelDiff(const std::vector<float>& a,
                         const std::vector<float>& b) {
  double scale = 1e-3, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(a[i])));
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
  }
  return diff / scale;
}

// Two workers of batch b reading their shards of `all` in order see, at step
// k, examples [k b, (k+1) b) and [n/2 + k b, ...). The result holds both, one
// after the other, at positions [2 b k, 2 b (k+1)), for one worker of batch 2b.
inline worker::Dataset Interleaved(const worker::Dataset& all, int64_t b,
                                   int64_t steps) {
  worker::Dataset single = all;
  const int64_t half = b * steps, px = all.image_size();
  for (int64_t k = 0; k < steps; ++k) {
    for (int64_t i = 0; i < 2 * b; ++i) {
      const int64_t from = i < b ? k * b + i : half + k * b + (i - b);
      const int64_t to = 2 * b * k + i;
      std::copy_n(all.pixels.begin() + from * px, px,
                  single.pixels.begin() + to * px);
      single.labels[to] = all.labels[from];
    }
  }
  return single;
}

// Expects a worker's two runs to end on the same bits: every parameter and
// every layer's running statistics. Run: a struct with `params`
// (nn::HostTensors) and `running` (std::vector<bn::RunningStats>).
template <typename Run>
void ExpectSameEnd(const Run& got, const Run& want) {
  ASSERT_EQ(got.params.size(), want.params.size());
  for (const auto& [name, t] : want.params) {
    EXPECT_EQ(got.params.at(name).values, t.values) << name;
  }
  ASSERT_EQ(got.running.size(), want.running.size());
  for (size_t l = 0; l < want.running.size(); ++l) {
    EXPECT_EQ(got.running[l].mean, want.running[l].mean) << "layer " << l;
    EXPECT_EQ(got.running[l].var, want.running[l].var) << "layer " << l;
  }
}

}  // namespace bnps::test

#endif  // BNPS_WORKER_TRAINING_TESTING_H_
