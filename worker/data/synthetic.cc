#include "worker/data/synthetic.h"

#include <algorithm>

namespace bnps::worker {
namespace {

// SplitMix64 (see batcher.cc).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Uniform in [lo, hi] (a slight modulo bias is harmless here).
  int Int(int lo, int hi) {
    return lo + static_cast<int>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }

 private:
  uint64_t state_;
};

}  // namespace

Dataset MakeSyntheticDataset(int64_t n, int64_t rows, int64_t cols,
                             int num_classes, uint64_t seed) {
  n = std::max<int64_t>(n, 0);
  rows = std::max<int64_t>(rows, 1);
  cols = std::max<int64_t>(cols, 1);
  num_classes = std::clamp(num_classes, 1, 256);

  Dataset d;
  d.rows = rows;
  d.cols = cols;
  d.num_classes = num_classes;
  d.labels.resize(static_cast<size_t>(n));
  d.pixels.resize(static_cast<size_t>(n * rows * cols));

  const int64_t bands = (num_classes + 1) / 2;
  Rng rng(seed ^ 0x5eed5eed5eed5eedULL);
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(i % num_classes);
    d.labels[i] = static_cast<uint8_t>(label);
    const bool horizontal = label % 2 == 0;
    const int64_t band = label / 2;
    const int64_t extent = horizontal ? rows : cols;
    const int64_t begin = band * extent / bands;
    const int64_t end = std::max(begin + 1, (band + 1) * extent / bands);
    const int brightness = rng.Int(160, 255);
    uint8_t* image = d.pixels.data() + i * rows * cols;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t at = horizontal ? r : c;
        int value = rng.Int(0, 50);  // background
        if (at >= begin && at < end && rng.Int(0, 9) != 0) {
          value = brightness - rng.Int(0, 40);
        }
        image[r * cols + c] = static_cast<uint8_t>(std::clamp(value, 0, 255));
      }
    }
  }
  return d;
}

}  // namespace bnps::worker
