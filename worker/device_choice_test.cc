#include "worker/device_choice.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bnps::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

DeviceRequest Request(std::string device, int gpu = -1, int replicas = 1) {
  DeviceRequest r;
  r.device = std::move(device);
  r.gpu = gpu;
  r.replicas = replicas;
  return r;
}

TEST(ChooseDevices, CpuWhenAsked) {
  absl::StatusOr<DeviceChoice> c = ChooseDevices(Request("cpu"), 4, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->cpu());
  EXPECT_EQ(c->Describe(), "cpu");
  EXPECT_EQ(c->reason, "--device=cpu");
}

TEST(ChooseDevices, AutoTakesTheCpuWithoutAGpuAndSaysWhy) {
  absl::StatusOr<DeviceChoice> c =
      ChooseDevices(Request("auto"), 0, "CUDA driver version is insufficient");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->cpu());
  EXPECT_THAT(c->reason, HasSubstr("chose the CPU"));
  EXPECT_THAT(c->reason, HasSubstr("driver version is insufficient"));
}

TEST(ChooseDevices, GpuWithoutAGpuIsAnError) {
  DeviceRequest r = Request("gpu");
  r.cuda_visible_devices = "";
  absl::StatusOr<DeviceChoice> c = ChooseDevices(r, 0, "");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("no usable GPU"));
  EXPECT_THAT(c.status().message(), HasSubstr("CUDA_VISIBLE_DEVICES="));
}

TEST(ChooseDevices, AutoTakesTheFirstGpuAndSaysWhy) {
  absl::StatusOr<DeviceChoice> c = ChooseDevices(Request("auto"), 2, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->gpus, ElementsAre(0));
  EXPECT_EQ(c->Describe(), "cuda:0");
  EXPECT_THAT(c->reason, HasSubstr("--device=auto chose the GPU (2 visible"));
}

TEST(ChooseDevices, LocalRankPicksTheDeviceModuloTheVisibleOnes) {
  DeviceRequest r = Request("gpu");
  r.local_rank = "3";
  absl::StatusOr<DeviceChoice> c = ChooseDevices(r, 2, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->gpus, ElementsAre(1));
  EXPECT_THAT(c->reason, HasSubstr("LOCAL_RANK=3 -> cuda:1"));
  EXPECT_THAT(c->reason, HasSubstr("shared with other local ranks"));
  r.local_rank = "1";
  c = ChooseDevices(r, 4, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->gpus, ElementsAre(1));
  EXPECT_THAT(c->reason, ::testing::Not(HasSubstr("shared")));
}

TEST(ChooseDevices, GpuFlagWinsOverLocalRank) {
  DeviceRequest r = Request("auto", /*gpu=*/2);
  r.local_rank = "1";
  r.cuda_visible_devices = "4,5,6";
  absl::StatusOr<DeviceChoice> c = ChooseDevices(r, 3, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->gpus, ElementsAre(2));
  EXPECT_THAT(c->reason, HasSubstr("--gpu=2"));
  EXPECT_THAT(c->reason, HasSubstr("CUDA_VISIBLE_DEVICES=4,5,6"));
}

TEST(ChooseDevices, BadLocalRankOrGpuAreErrors) {
  DeviceRequest r = Request("gpu");
  for (const char* bad : {"", "-1", "two", "99999999999"}) {
    r.local_rank = bad;
    absl::StatusOr<DeviceChoice> c = ChooseDevices(r, 1, "");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(c.status().message(), HasSubstr("LOCAL_RANK")) << bad;
  }
  absl::StatusOr<DeviceChoice> c = ChooseDevices(Request("gpu", 1), 1, "");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("--gpu=1 but 1 CUDA device is visible"));
  EXPECT_EQ(ChooseDevices(Request("gpu", -2), 1, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseDevices(Request("tpu"), 1, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseDevices(Request("gpu", -1, 0), 1, "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChooseDevices, ReplicasShareADeviceWhenThereAreFewerGpus) {
  absl::StatusOr<DeviceChoice> c = ChooseDevices(Request("gpu", -1, 3), 1, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->gpus, ElementsAre(0, 0, 0));
  EXPECT_EQ(c->Describe(), "cuda:0 (3 replicas share it)");
  EXPECT_THAT(c->reason, HasSubstr("3 replicas on their own streams share it"));
}

TEST(ChooseDevices, ReplicasTakeConsecutiveDevicesAndWrapAround) {
  absl::StatusOr<DeviceChoice> c = ChooseDevices(Request("gpu", 1, 3), 2, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->gpus, ElementsAre(1, 0, 1));
  EXPECT_EQ(c->Describe(), "cuda:1,cuda:0 (3 replicas share them)");
  c = ChooseDevices(Request("gpu", 0, 2), 4, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->gpus, ElementsAre(0, 1));
  EXPECT_EQ(c->Describe(), "cuda:0,cuda:1");
}

}  // namespace
}  // namespace bnps::worker
