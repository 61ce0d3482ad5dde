#include "client/state_export.h"

#include <cstring>

#include "gtest/gtest.h"

namespace bnps::client {
namespace {

TEST(StateExportTest, TheBuiltInModelsKeysBecomePyTorchNames) {
  EXPECT_EQ(TorchParameterName("stem.conv.w"), "stem.conv.weight");
  EXPECT_EQ(TorchParameterName("head.fc.b"), "head.fc.bias");
  EXPECT_EQ(TorchParameterName("stage1.block0.bn1.gamma"),
            "stage1.block0.bn1.weight");
  EXPECT_EQ(TorchParameterName("stem.bn.beta"), "stem.bn.bias");
  // Keys with PyTorch's names already (bnps.torch) stay as they are.
  EXPECT_EQ(TorchParameterName("layer1.0.conv1.weight"), "layer1.0.conv1.weight");
  EXPECT_EQ(TorchParameterName("fc.bias"), "fc.bias");
  EXPECT_EQ(TorchParameterName(".w"), ".w");
}

TEST(StateExportTest, ParametersAndRunningStatisticsAsPyTorchHasThem) {
  JobState state;
  state.step = 94;
  state.params["head.fc.w"] = {{1, 2}, {0.5f, -1.0f}};
  state.running["stem.bn"] = {{0.25, 1.0 / 3}, {2.0, 0.5}};
  absl::StatusOr<std::map<std::string, util::SafeTensor>> t =
      ExportTensors(state);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 4u);
  const util::SafeTensor& w = t->at("head.fc.weight");
  EXPECT_EQ(w.dtype, "F32");
  EXPECT_EQ(w.shape, (std::vector<int64_t>{1, 2}));
  float wv[2];
  std::memcpy(wv, w.data.data(), 8);
  EXPECT_EQ(wv[0], 0.5f);
  EXPECT_EQ(wv[1], -1.0f);
  const util::SafeTensor& mean = t->at("stem.bn.running_mean");
  EXPECT_EQ(mean.dtype, "F32");
  float mv[2];
  std::memcpy(mv, mean.data.data(), 8);
  EXPECT_EQ(mv[1], static_cast<float>(1.0 / 3));
  EXPECT_EQ(t->at("stem.bn.running_var").shape, (std::vector<int64_t>{2}));
  const util::SafeTensor& tracked = t->at("stem.bn.num_batches_tracked");
  EXPECT_EQ(tracked.dtype, "I64");
  EXPECT_TRUE(tracked.shape.empty());
  int64_t n = 0;
  std::memcpy(&n, tracked.data.data(), 8);
  EXPECT_EQ(n, 94);
  absl::StatusOr<std::string> bytes = EncodeExport(state);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_NE(bytes->find("\"bnps_step\":\"94\""), std::string::npos);
}

TEST(StateExportTest, TwoKeysOfOneNameAreRefused) {
  JobState state;
  state.params["fc.w"] = {{1}, {1.0f}};
  state.params["fc.weight"] = {{1}, {2.0f}};
  EXPECT_EQ(ExportTensors(state).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bnps::client
