// Synchronized BN across workers equals BN over the concatenated batch: split a
// batch along N into W uneven parts (some empty), merge the parts' moments, reduce
// the parts' backward sums, and every part's output and input gradient must match
// whole-batch BN.

#include <cstdio>
#include <ostream>
#include <vector>

#include "bn/cpu_kernels.h"
#include "bn/reference.h"
#include "gtest/gtest.h"

namespace bnps::bn {
namespace {

using reference::MaxRelativeError;

constexpr double kEps = 1e-5;

struct SplitCase {
  Shape shape;
  std::vector<int64_t> part_sizes;  // along N; sums to shape.n
  double mean;
  double std;
};

void PrintTo(const SplitCase& c, std::ostream* os) {
  *os << c.shape.ToString() << " split";
  for (int64_t n : c.part_sizes) *os << " " << n;
  *os << ", mean " << c.mean << " std " << c.std;
}

class SplitEquivalenceTest : public ::testing::TestWithParam<SplitCase> {};

TEST_P(SplitEquivalenceTest, PartsMatchWholeBatch) {
  const SplitCase& tc = GetParam();
  const Shape& whole = tc.shape;
  auto kernels = NewCpuBnKernels();
  const std::vector<float> x =
      reference::RandomTensor(whole, tc.mean, tc.std, whole.Elements(), 0.3);
  const std::vector<float> dy =
      reference::RandomTensor(whole, 0.2, 1.0, whole.Elements() + 1);
  const std::vector<float> gamma = reference::RandomVector(whole.c, 0.5, 2, 3);
  const std::vector<float> beta = reference::RandomVector(whole.c, -1, 1, 4);
  const int num_parts = tc.part_sizes.size();

  struct Part {
    Shape shape;
    std::vector<float> x, dy;
  };
  std::vector<Part> parts;
  int64_t begin = 0;
  for (int64_t size : tc.part_sizes) {
    Shape s = whole;
    s.n = size;
    parts.push_back({s, reference::SliceBatch(x, whole, begin, begin + size),
                     reference::SliceBatch(dy, whole, begin, begin + size)});
    begin += size;
  }
  ASSERT_EQ(begin, whole.n);

  // Forward: each part's moments, merged in worker order.
  OrderedMerger merger(num_parts, whole.c);
  for (int w = 0; w < num_parts; ++w) {
    absl::StatusOr<Moments> m =
        kernels->ComputeMoments(parts[w].x.data(), parts[w].shape);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(merger.Add(w, *std::move(m)).ok());
  }
  const Moments global = merger.Merge();
  const std::vector<double> var = BiasedVariance(global);
  const Normalization norm{global.mean, var, gamma, beta, kEps};

  std::vector<float> y, dx;
  BackwardSums sums = BackwardSums::Zero(whole.c);
  for (Part& p : parts) {
    std::vector<float> part_y(p.x.size());
    ASSERT_TRUE(kernels->Normalize(p.x.data(), p.shape, norm, part_y.data()).ok());
    y.insert(y.end(), part_y.begin(), part_y.end());
    absl::StatusOr<BackwardSums> local =
        kernels->BackwardReduce(p.dy.data(), p.x.data(), p.shape, norm);
    ASSERT_TRUE(local.ok()) << local.status();
    ASSERT_TRUE(AddSums(*local, &sums).ok());
  }
  for (Part& p : parts) {
    std::vector<float> part_dx(p.x.size());
    ASSERT_TRUE(kernels
                    ->BackwardInput(p.dy.data(), p.x.data(), p.shape, norm, sums,
                                    global.count, part_dx.data())
                    .ok());
    dx.insert(dx.end(), part_dx.begin(), part_dx.end());
  }

  // Whole-batch BN in double.
  const reference::Stats st = reference::ComputeStats(x, whole);
  const std::vector<double> y_want =
      reference::Normalize(x, whole, st.mean, st.var, gamma, beta, kEps);
  const reference::Gradients g = reference::Backward(dy, x, whole, gamma, kEps);

  EXPECT_EQ(global.count, st.count);
  EXPECT_LT(MaxRelativeError(global.mean, st.mean), 1e-12);
  EXPECT_LT(MaxRelativeError(var, st.var, 1e-6), 1e-9);
  EXPECT_LT(MaxRelativeError(y, y_want), 1e-5);
  EXPECT_LT(MaxRelativeError(dx, g.dx, 1e-6), 1e-5);
  EXPECT_LT(MaxRelativeError(sums.sum_dy, g.dbeta, 1e-6), 1e-9);
  EXPECT_LT(MaxRelativeError(sums.sum_dy_xhat, g.dgamma, 1e-6), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Splits, SplitEquivalenceTest,
    ::testing::Values(
        SplitCase{{12, 4, 5, 5}, {3, 0, 7, 2}, 0.5, 2.0},
        SplitCase{{9, 1, 3, 3}, {0, 9}, -2.0, 1.0},           // one worker has all
        SplitCase{{8, 6, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1}, 1.0, 0.5},  // N=1 each
        SplitCase{{17, 16, 4, 4}, {5, 0, 0, 11, 1}, 0.0, 1.0},
        SplitCase{{10, 3, 6, 6}, {4, 6}, 1e4, 1.0},           // |mean| >> std
        SplitCase{{33, 7, 2, 3}, {10, 10, 10, 3}, 3.0, 4.0}));

}  // namespace
}  // namespace bnps::bn
