#include "worker/data/dataset.h"

#include "absl/strings/str_cat.h"

namespace bnps::worker {

absl::Status ValidateDataset(const Dataset& d) {
  if (d.rows < 1 || d.cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset: images are ", d.rows, "x", d.cols, "; need at least 1x1"));
  }
  if (d.num_classes < 1 || d.num_classes > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset: num_classes is ", d.num_classes, "; need 1 to 256"));
  }
  // pixels.size() / size() cannot overflow where the product could.
  const uint64_t image_size = static_cast<uint64_t>(d.rows) * d.cols;
  if (d.pixels.size() % image_size != 0 ||
      d.pixels.size() / image_size != d.labels.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset: ", d.pixels.size(), " pixels for ", d.labels.size(),
        " labels of ", d.rows, "x", d.cols, " images"));
  }
  for (size_t i = 0; i < d.labels.size(); ++i) {
    if (d.labels[i] >= d.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dataset: label ", static_cast<int>(d.labels[i]), " of example ", i,
          " is outside [0, ", d.num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace bnps::worker
