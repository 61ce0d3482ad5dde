// Time of the server's optimizer step (store::ParameterStore::Push of the one worker
// of a bulk-synchronous job, which applies SGD with momentum and weight decay
// at once) against the memory-bandwidth roof: the bytes the step must move
// (gradient, weights and momentum read, weights and momentum written: 20 bytes
// per element) over its time, next to a memcpy of as many bytes in the same
// run. Both use every core, as the server's step does.
//
//   bazel run -c opt //bench:optimizer_benchmark -- --reps=20

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "util/median_time.h"
#include "store/parameter_store.h"

ABSL_FLAG(int, reps, 20, "Timed repetitions per size (median reported).");

namespace bnps::server {
namespace {

using util::MedianSeconds;

int Main() {
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  std::printf(
      "| elements | MB | SGD step ms | SGD GB/s | memcpy GB/s | SGD/memcpy |\n"
      "|---:|---:|---:|---:|---:|---:|\n");
  for (int64_t n : {int64_t{1} << 18, int64_t{1} << 20, int64_t{1} << 22,
                    int64_t{1} << 24}) {
    store::ParameterStore::Options options;
    options.optimizer.weight_decay = 1e-4;
    store::ParameterStore store(options);
    if (absl::StatusOr<bool> s = store.Init("w", {n}, std::vector<float>(n, 0.5f));
        !s.ok()) {
      std::fprintf(stderr, "optimizer_benchmark: %s\n",
                   s.status().ToString().c_str());
      return 1;
    }
    std::vector<float> grad(n);
    for (int64_t i = 0; i < n; ++i) grad[i] = 1e-3f * static_cast<float>(i % 7);
    int64_t step = 0;
    bool ok = true;
    const double sgd = util::MedianSeconds(reps, [&] {
      ok &= store.Push(0, step++, "w", {n}, grad, 32).ok();
    });
    if (!ok) {
      std::fprintf(stderr, "optimizer_benchmark: a push was refused\n");
      return 1;
    }
    // A copy of 10 bytes per element reads 10 and writes 10, as the step
    // reads and writes 20 (though a copy's plain stores may also read each
    // destination line first, which the step, writing lines it just read,
    // does not: the ratio leans toward the step). In blocks across the
    // cores, as the step runs.
    const int64_t half = 10 * n, block = int64_t{1} << 20;
    std::vector<char> from(half, 1), to(half);
    const double copy = util::MedianSeconds(reps, [&] {
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < half; b += block) {
        std::memcpy(to.data() + b, from.data() + b, std::min(block, half - b));
      }
    });
    if (to[half - 1] != 1) return 1;  // the copies happened
    const int64_t bytes = 20 * n;
    const double sgd_gbs = bytes / sgd / 1e9;
    const double copy_gbs = bytes / copy / 1e9;
    std::printf("| %lld | %.0f | %.2f | %.1f | %.1f | %.2f |\n",
                static_cast<long long>(n), 4.0 * n / (1 << 20), sgd * 1e3,
                sgd_gbs, copy_gbs, sgd_gbs / copy_gbs);
  }
  return 0;
}

}  // namespace
}  // namespace bnps::server

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return bnps::server::Main();
}
