// An in-memory image-classification dataset: N grayscale images of rows x cols
// uint8 pixels (row-major, image after image) and one uint8 label per image.
//
// This is what the loaders (worker/data/idx.h for Fashion-MNIST's IDX files,
// worker/data/synthetic.h for generated data) produce and what the Batcher
// (worker/data/batcher.h) consumes.
//
// Thread-safety: a plain value; concurrent reads are safe.

#ifndef BNPS_WORKER_DATA_DATASET_H_
#define BNPS_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace bnps::worker {

struct Dataset {
  int64_t rows = 0;
  int64_t cols = 0;
  // Labels are in [0, num_classes).
  int num_classes = 10;
  // size() * rows * cols bytes: image i starts at pixels[i * rows * cols].
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> labels;  // size() labels

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  int64_t image_size() const { return rows * cols; }
};

// OK if `d` is consistent: rows, cols >= 1, num_classes in [1, 256],
// pixels.size() == size() * rows * cols and every label < num_classes.
// INVALID_ARGUMENT, naming what is wrong, otherwise.
absl::Status ValidateDataset(const Dataset& d);

}  // namespace bnps::worker

#endif  // BNPS_WORKER_DATA_DATASET_H_
