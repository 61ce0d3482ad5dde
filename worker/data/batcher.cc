#include "worker/data/batcher.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/data/elastic_shard.h"

namespace bnps::worker {
namespace {

// SplitMix64 (Steele, Lea, Flood 2014): small, fast, fully specified, so the
// permutation does not depend on the standard library's implementation.
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}

  uint64_t Next() { return Mix64(state_ += kGolden); }

  // Uniform in [0, bound), without modulo bias. REQUIRES: bound >= 1.
  uint64_t Uniform(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    uint64_t r;
    do {
      r = Next();
    } while (r < threshold);
    return r % bound;
  }

 private:
  uint64_t state_;
};

}  // namespace

std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch,
                                      bool shuffle) {
  std::vector<int64_t> p(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::iota(p.begin(), p.end(), int64_t{0});
  if (!shuffle) return p;
  SplitMix64 rng(Mix64(Mix64(seed + kGolden) + static_cast<uint64_t>(epoch)));
  // Fisher-Yates.
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.Uniform(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

int64_t EffectiveExamples(const BatcherOptions& options, int64_t dataset_size) {
  const int64_t n = std::max<int64_t>(dataset_size, 0);
  return options.limit > 0 ? std::min(options.limit, n) : n;
}

int64_t StepsPerEpoch(const BatcherOptions& options, int64_t dataset_size) {
  const int64_t workers =
      options.epoch_workers > 0 ? options.epoch_workers : options.num_workers;
  if (workers < 1 || options.batch_size < 1) return 0;
  const int64_t n = EffectiveExamples(options, dataset_size);
  const int64_t largest = (n + workers - 1) / workers;
  return options.drop_last
             ? largest / options.batch_size
             : (largest + options.batch_size - 1) / options.batch_size;
}

absl::StatusOr<Batcher> Batcher::Create(const Dataset* dataset,
                                        BatcherOptions options) {
  if (dataset == nullptr) {
    return absl::InvalidArgumentError("Batcher: the dataset is null");
  }
  if (absl::Status s = ValidateDataset(*dataset); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Batcher: ", s.message()));
  }
  if (dataset->size() == 0) {
    return absl::InvalidArgumentError("Batcher: the dataset is empty");
  }
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Batcher: num_workers is ", options.num_workers, "; need >= 1"));
  }
  if (options.worker < 0 || options.worker >= options.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("Batcher: worker is ", options.worker, "; need [0, ",
                     options.num_workers, ")"));
  }
  if (options.epoch_workers < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Batcher: epoch_workers is ", options.epoch_workers,
        "; need >= 0 (0 for num_workers)"));
  }
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Batcher: batch_size is ", options.batch_size, "; need >= 1"));
  }
  if (options.limit < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Batcher: limit is ", options.limit, "; need >= 0 (0 for all)"));
  }
  if (!std::isfinite(options.mean) || !std::isfinite(options.std) ||
      !(options.std > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Batcher: mean ", options.mean, " and std ", options.std,
                     "; need finite values and std > 0"));
  }
  Batcher batcher(dataset, options);
  batcher.StartEpoch(0);
  return batcher;
}

Batcher::Batcher(const Dataset* dataset, const BatcherOptions& options)
    : dataset_(dataset), options_(options) {
  if (options_.epoch_workers == 0) options_.epoch_workers = options_.num_workers;
  examples_ = EffectiveExamples(options_, dataset_->size());
  const int64_t w = options_.worker;
  const int64_t workers = options_.epoch_workers;
  shard_begin_ = w * examples_ / workers;
  shard_end_ = (w + 1) * examples_ / workers;
  steps_per_epoch_ = StepsPerEpoch(options_, dataset_->size());
  for (int p = 0; p < 256; ++p) {
    normalized_[p] =
        (static_cast<float>(p) / 255.0f - options_.mean) / options_.std;
  }
}

void Batcher::StartEpoch(int64_t epoch) {
  epoch_ = epoch;
  step_ = 0;
  permutation_ = EpochPermutation(examples_, options_.seed, epoch,
                                  options_.shuffle);
}

absl::Status Batcher::SetNumWorkers(int num_workers) {
  if (options_.worker < 0 || options_.worker >= num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("Batcher: worker ", options_.worker, " is not one of ",
                     num_workers, " workers"));
  }
  options_.num_workers = num_workers;
  return absl::OkStatus();
}

bool Batcher::Next(Batch* out) {
  if (step_ >= steps_per_epoch_) return false;
  const EpochCut cut{examples_, options_.epoch_workers, options_.batch_size,
                     options_.drop_last};
  const std::vector<int64_t> positions =
      StepPositions(cut, step_, options_.worker, options_.num_workers);
  const int64_t n = static_cast<int64_t>(positions.size());

  const int64_t image_size = dataset_->image_size();
  out->n = n;
  out->channels = 1;
  out->height = dataset_->rows;
  out->width = dataset_->cols;
  out->images.resize(static_cast<size_t>(n * image_size));
  out->labels.resize(static_cast<size_t>(n));
  out->indices.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t index = permutation_[positions[i]];
    out->indices[i] = index;
    out->labels[i] = dataset_->labels[index];
    const uint8_t* src = dataset_->pixels.data() + index * image_size;
    float* dst = out->images.data() + i * image_size;
    for (int64_t k = 0; k < image_size; ++k) dst[k] = normalized_[src[k]];
  }
  ++step_;
  return true;
}

int64_t Batcher::examples_per_epoch() const {
  const int64_t shard = shard_end_ - shard_begin_;
  return options_.drop_last ? shard / options_.batch_size * options_.batch_size
                            : shard;
}

}  // namespace bnps::worker
