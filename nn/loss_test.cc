#include "nn/loss.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace bnps::nn {
namespace {

TEST(SoftmaxCrossEntropyTest, KnownValues) {
  const std::vector<float> logits = {0, 0, 1, 2, 3, 1000};
  const std::vector<int32_t> labels = {1, 2};
  std::vector<float> d(6);
  absl::StatusOr<LossResult> r =
      SoftmaxCrossEntropy(logits.data(), 2, 3, labels.data(), d.data());
  ASSERT_TRUE(r.ok()) << r.status();
  const double z0 = 2 + std::exp(1.0);
  // Example 1 puts all its mass on its label: loss 0, no overflow.
  EXPECT_NEAR(r->loss_sum, std::log(z0), 1e-9);
  EXPECT_EQ(r->correct, 1);
  EXPECT_EQ(r->n, 2);
  EXPECT_NEAR(d[0], 1 / z0, 1e-7);
  EXPECT_NEAR(d[1], 1 / z0 - 1, 1e-7);
  EXPECT_NEAR(d[2], std::exp(1.0) / z0, 1e-7);
  EXPECT_NEAR(d[3], 0, 1e-7);
  EXPECT_NEAR(d[5], 0, 1e-7);
}

TEST(SoftmaxCrossEntropyTest, GradientMatchesFiniteDifferences) {
  std::vector<float> logits = {0.3f, -1.2f, 2.0f, 0.5f};
  const std::vector<int32_t> labels = {3};
  std::vector<float> d(4);
  ASSERT_TRUE(
      SoftmaxCrossEntropy(logits.data(), 1, 4, labels.data(), d.data()).ok());
  for (int k = 0; k < 4; ++k) {
    const float h = 1e-2f, saved = logits[k];
    logits[k] = saved + h;
    const double up =
        SoftmaxCrossEntropy(logits.data(), 1, 4, labels.data(), nullptr)
            ->loss_sum;
    logits[k] = saved - h;
    const double down =
        SoftmaxCrossEntropy(logits.data(), 1, 4, labels.data(), nullptr)
            ->loss_sum;
    logits[k] = saved;
    EXPECT_NEAR(d[k], (up - down) / (2 * h), 1e-4) << k;
  }
}

TEST(SoftmaxCrossEntropyTest, BadInput) {
  const std::vector<float> logits = {0, 0, NAN, 0};
  const std::vector<int32_t> bad_label = {2, 0};
  const std::vector<int32_t> good = {0, 1};
  EXPECT_EQ(SoftmaxCrossEntropy(logits.data(), 1, 2, bad_label.data(), nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SoftmaxCrossEntropy(logits.data(), 2, 2, good.data(), nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SoftmaxCrossEntropy(nullptr, 0, 2, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace bnps::nn
