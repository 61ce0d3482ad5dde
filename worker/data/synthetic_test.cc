#include "worker/data/synthetic.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace bnps::worker {
namespace {

TEST(SyntheticTest, Shapes) {
  const Dataset d = MakeSyntheticDataset(100, 28, 28, 10, 1);
  EXPECT_EQ(d.size(), 100);
  EXPECT_EQ(d.rows, 28);
  EXPECT_EQ(d.cols, 28);
  EXPECT_EQ(d.num_classes, 10);
  EXPECT_EQ(d.pixels.size(), 100u * 28 * 28);
  EXPECT_TRUE(ValidateDataset(d).ok()) << ValidateDataset(d);

  const Dataset odd = MakeSyntheticDataset(7, 5, 9, 3, 1);
  EXPECT_EQ(odd.pixels.size(), 7u * 5 * 9);
  EXPECT_TRUE(ValidateDataset(odd).ok()) << ValidateDataset(odd);

  const Dataset tiny = MakeSyntheticDataset(3, 1, 1, 1, 1);
  EXPECT_TRUE(ValidateDataset(tiny).ok()) << ValidateDataset(tiny);
  EXPECT_EQ(MakeSyntheticDataset(0, 28, 28, 10, 1).size(), 0);
}

TEST(SyntheticTest, LabelsInRangeAndBalanced) {
  const Dataset d = MakeSyntheticDataset(1000, 28, 28, 10, 3);
  std::vector<int> per_class(10);
  for (uint8_t label : d.labels) {
    ASSERT_LT(label, 10);
    ++per_class[label];
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], 100) << c;
}

TEST(SyntheticTest, DeterministicBySeed) {
  const Dataset a = MakeSyntheticDataset(50, 28, 28, 10, 5);
  const Dataset b = MakeSyntheticDataset(50, 28, 28, 10, 5);
  const Dataset c = MakeSyntheticDataset(50, 28, 28, 10, 6);
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.pixels, c.pixels);
}

// Per-class mean images of `d`.
std::vector<std::vector<double>> ClassMeans(const Dataset& d) {
  const int64_t size = d.image_size();
  std::vector<std::vector<double>> means(d.num_classes,
                                         std::vector<double>(size));
  std::vector<int64_t> counts(d.num_classes);
  for (int64_t i = 0; i < d.size(); ++i) {
    const int label = d.labels[i];
    ++counts[label];
    for (int64_t k = 0; k < size; ++k) {
      means[label][k] += d.pixels[i * size + k];
    }
  }
  for (int c = 0; c < d.num_classes; ++c) {
    for (double& v : means[c]) v /= counts[c];
  }
  return means;
}

double SquaredDistance(const std::vector<double>& a, const uint8_t* b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += (a[k] - b[k]) * (a[k] - b[k]);
  return s;
}

TEST(SyntheticTest, ClassesAreDistinguishable) {
  const Dataset train = MakeSyntheticDataset(500, 28, 28, 10, 11);
  const std::vector<std::vector<double>> means = ClassMeans(train);
  // Class means are far apart: at least a bar's worth of bright pixels.
  for (int a = 0; a < 10; ++a) {
    for (int b = a + 1; b < 10; ++b) {
      double s = 0;
      for (size_t k = 0; k < means[a].size(); ++k) {
        s += (means[a][k] - means[b][k]) * (means[a][k] - means[b][k]);
      }
      EXPECT_GT(std::sqrt(s), 1000.0) << a << " vs " << b;
    }
  }
  // A nearest-class-mean classifier gets fresh examples right.
  const Dataset test = MakeSyntheticDataset(500, 28, 28, 10, 12);
  int correct = 0;
  for (int64_t i = 0; i < test.size(); ++i) {
    const uint8_t* image = test.pixels.data() + i * test.image_size();
    int best = -1;
    double best_distance = std::numeric_limits<double>::infinity();
    for (int c = 0; c < 10; ++c) {
      const double distance = SquaredDistance(means[c], image);
      if (distance < best_distance) {
        best_distance = distance;
        best = c;
      }
    }
    correct += best == test.labels[i];
  }
  EXPECT_GE(correct, 490) << "of 500";
}

}  // namespace
}  // namespace bnps::worker
