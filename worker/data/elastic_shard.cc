#include "worker/data/elastic_shard.h"

#include <algorithm>

namespace bnps::worker {
namespace {

// Appends base worker b's positions of step k.
void AppendBase(const EpochCut& cut, int64_t k, int b,
                std::vector<int64_t>* out) {
  const int64_t n = cut.examples;
  const int64_t w0 = cut.base_workers;
  const int64_t shard_end = (b + 1) * n / w0;
  const int64_t begin = b * n / w0 + k * cut.batch_size;
  int64_t len = std::clamp<int64_t>(shard_end - begin, 0, cut.batch_size);
  if (cut.drop_last && len < cut.batch_size) len = 0;
  for (int64_t i = 0; i < len; ++i) out->push_back(begin + i);
}

}  // namespace

std::vector<int64_t> StepPositions(const EpochCut& cut, int64_t step_in_epoch,
                                   int worker, int num_workers) {
  std::vector<int64_t> out;
  if (cut.base_workers < 1 || cut.batch_size < 1 || num_workers < 1 ||
      worker < 0 || worker >= num_workers || step_in_epoch < 0) {
    return out;
  }
  if (num_workers == cut.base_workers) {
    AppendBase(cut, step_in_epoch, worker, &out);
    return out;
  }
  std::vector<int64_t> global;
  for (int b = 0; b < cut.base_workers; ++b) {
    AppendBase(cut, step_in_epoch, b, &global);
  }
  const int64_t g = static_cast<int64_t>(global.size());
  const int64_t begin = worker * g / num_workers;
  const int64_t end = (worker + 1) * g / num_workers;
  out.assign(global.begin() + begin, global.begin() + end);
  return out;
}

}  // namespace bnps::worker
