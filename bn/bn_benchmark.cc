// Throughput of the CPU BN kernels against the memory-bandwidth roof: for each
// kernel and shape, the bytes the kernel must move (each input read once, each
// output written once) over its time, next to a memcpy moving the same number of
// bytes in the same run. Single-threaded, like the kernels.
//
//   bazel run -c opt //bn:bn_benchmark -- --reps=30

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "bn/cpu_kernels.h"
#include "util/median_time.h"

ABSL_FLAG(int, reps, 30, "Timed repetitions per measurement (median reported).");

namespace bnps::bn {
namespace {

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bn_benchmark: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
}

void Run(const Shape& shape, int reps) {
  auto kernels = NewCpuBnKernels();
  const size_t e = shape.Elements();
  std::vector<float> x(e), dy(e), y(e), dx(e);
  for (size_t i = 0; i < e; ++i) {
    x[i] = static_cast<float>((i * 2654435761u) % 1000) / 100.0f;
    dy[i] = static_cast<float>((i * 40503u) % 777) / 300.0f - 1.0f;
  }
  absl::StatusOr<Moments> m = kernels->ComputeMoments(x.data(), shape);
  Check(m.status());
  const std::vector<double> var = BiasedVariance(*m);
  const std::vector<float> gamma(shape.c, 1.1f), beta(shape.c, 0.1f);
  const Normalization norm{m->mean, var, gamma, beta, 1e-5};
  absl::StatusOr<BackwardSums> sums =
      kernels->BackwardReduce(dy.data(), x.data(), shape, norm);
  Check(sums.status());

  struct Row {
    const char* name;
    size_t bytes;
    std::function<void()> fn;
  };
  const size_t t = e * sizeof(float);
  const std::vector<Row> rows = {
      {"moments", t, [&] { Check(kernels->ComputeMoments(x.data(), shape).status()); }},
      {"normalize", 2 * t,
       [&] { Check(kernels->Normalize(x.data(), shape, norm, y.data())); }},
      {"forward (moments+normalize)", 3 * t,
       [&] {
         absl::StatusOr<Moments> mm = kernels->ComputeMoments(x.data(), shape);
         Check(mm.status());
         Check(kernels->Normalize(x.data(), shape, norm, y.data()));
       }},
      {"backward reduce", 2 * t,
       [&] {
         Check(kernels->BackwardReduce(dy.data(), x.data(), shape, norm).status());
       }},
      {"backward input", 3 * t,
       [&] {
         Check(kernels->BackwardInput(dy.data(), x.data(), shape, norm, *sums,
                                      shape.PerChannel(), dx.data()));
       }},
  };
  // A memcpy of k bytes moves 2k (read + write): copy bytes/2 to move `bytes`.
  std::vector<char> src(3 * t), dst(3 * t);
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 2, dst.size());
  for (const Row& row : rows) {
    const double secs = util::MedianSeconds(reps, row.fn);
    const size_t half = row.bytes / 2;
    const double copy_secs = util::MedianSeconds(reps, [&] {
      std::memcpy(dst.data(), src.data(), half);
      asm volatile("" : : "r"(dst.data()) : "memory");
    });
    const double gbs = row.bytes / secs / 1e9;
    const double copy_gbs = row.bytes / copy_secs / 1e9;
    std::printf("| %-18s | %-28s | %9.1f | %8.1f | %8.2f | %9.2f | %5.2f |\n",
                shape.ToString().c_str(), row.name, secs * 1e6,
                row.bytes / 1e6, gbs, copy_gbs, gbs / copy_gbs);
  }
}

}  // namespace
}  // namespace bnps::bn

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Prints the throughput of the CPU BN kernels next to memcpy.");
  absl::ParseCommandLine(argc, argv);
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  std::printf(
      "| shape              | kernel                       | time us   | MB moved "
      "| GB/s     | memcpy GB/s | ratio |\n"
      "|--------------------|------------------------------|-----------|----------"
      "|----------|-------------|-------|\n");
  for (const bnps::bn::Shape& shape :
       {bnps::bn::Shape{32, 64, 28, 28}, bnps::bn::Shape{32, 256, 14, 14}}) {
    bnps::bn::Run(shape, reps);
  }
  return 0;
}
