// Loads IDX files (the format of MNIST and Fashion-MNIST) into a Dataset.
//
// An IDX file is a big-endian header followed by raw uint8 data:
//   images: magic 0x00000803, count, rows, cols (uint32 each), then
//           count * rows * cols pixels, row-major, image after image;
//   labels: magic 0x00000801, count (uint32), then count labels.
// Files may be gzip-compressed (as Debian's dataset-fashion-mnist ships them,
// in /usr/share/datasets/fashion-mnist) or plain: zlib's gzread reads both.
//
// A corrupt file is an error, never a crash, and never makes the loader
// allocate what the header claims before the data is there: counts are capped
// (rows * cols <= kMaxIdxImageSize, count <= kMaxIdxCount, all pixels together
// <= kMaxIdxPixelBytes) and buffers grow with the data actually read.
//
// Example:
//   absl::StatusOr<Dataset> train =
//       LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain);
//   if (!train.ok()) return train.status();
//   // train->size() == 60000, train->rows == train->cols == 28
//
// Errors (every message names the file):
//   NOT_FOUND          a file does not exist (the message says how to install
//                      Fashion-MNIST); other open errors map from errno
//                      (PERMISSION_DENIED, ...); FAILED_PRECONDITION for a
//                      directory;
//   DATA_LOSS          bad magic, a header over the caps, zero rows or cols,
//                      truncated data, bytes after the data, a corrupt gzip
//                      stream, image and label counts that differ, a label
//                      >= num_classes;
//   INVALID_ARGUMENT   num_classes outside [1, 256].
//
// Thread-safety: the functions are thread-safe (they share no state).

#ifndef BNPS_WORKER_DATA_IDX_H_
#define BNPS_WORKER_DATA_IDX_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace bnps::worker {

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr char kDefaultFashionMnistDir[] =
    "/usr/share/datasets/fashion-mnist";

// Caps on what a header may claim.
inline constexpr int64_t kMaxIdxImageSize = int64_t{1} << 20;   // rows * cols
inline constexpr int64_t kMaxIdxCount = int64_t{1} << 26;       // images
inline constexpr int64_t kMaxIdxPixelBytes = int64_t{1} << 32;  // all pixels

// Reads an images file and the matching labels file. The result's num_classes
// is `num_classes`; every label must be below it.
absl::StatusOr<Dataset> LoadIdx(const std::string& images_path,
                                const std::string& labels_path,
                                int num_classes = 10);

enum class Split { kTrain, kTest };

// Loads a split of Fashion-MNIST from `dir` (kDefaultFashionMnistDir for the
// Debian package): train-{images-idx3,labels-idx1}-ubyte.gz (60000 images) or
// t10k-{images-idx3,labels-idx1}-ubyte.gz (10000 images), 28x28, 10 classes.
// Where a .gz file is missing but the same name without .gz exists (files
// unpacked by hand), that one is read.
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split);

}  // namespace bnps::worker

#endif  // BNPS_WORKER_DATA_IDX_H_
