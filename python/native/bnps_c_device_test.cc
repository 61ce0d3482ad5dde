#include "python/native/bnps_c_device.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/stream_exchanges.h"
#include "gtest/gtest.h"

namespace bnps::c_abi {
namespace {

TEST(HostDeviceOpsTest, CopiesAtOnceIntoZeroedBuffers) {
  std::unique_ptr<DeviceOps> d = NewHostDeviceOps();
  absl::StatusOr<void*> buffer = d->HostBuffer(16);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto* host = static_cast<float*>(*buffer);
  EXPECT_EQ(host[3], 0.0f);
  const float device[4] = {1, 2, 3, 4};
  ASSERT_TRUE(d->ToHost(nullptr, host, device, sizeof(device)).ok());
  EXPECT_EQ(host[2], 3.0f);
  float back[4] = {};
  ASSERT_TRUE(d->ToDevice(nullptr, back, host, sizeof(back)).ok());
  EXPECT_EQ(back[3], 4.0f);
  EXPECT_FALSE(*d->Capturing(nullptr));
}

// A "capture": copies and jobs recorded, each replay runs them all again in
// order, as a CUDA graph's replay does; outside the recording they run at
// once.
TEST(RecorderTest, ReplaysCopiesAndJobsInOrder) {
  std::shared_ptr<Recorder> r = Recorder::New();
  std::unique_ptr<DeviceOps> d = r->NewDeviceOps();
  client::StreamExchanges q(r->NewLauncher());
  float device = 1.0f, host = 0.0f;
  std::vector<float> seen;
  r->SetRecording(true);
  EXPECT_TRUE(*d->Capturing(nullptr));
  ASSERT_TRUE(d->ToHost(nullptr, &host, &device, sizeof(float)).ok());
  client::StreamExchanges::Job job;
  job.exchange = [&]() {
    seen.push_back(host);
    host *= 10;
    return absl::OkStatus();
  };
  ASSERT_TRUE(q.EnqueueReplayable(nullptr, std::move(job)).ok());
  ASSERT_TRUE(d->ToDevice(nullptr, &device, &host, sizeof(float)).ok());
  EXPECT_TRUE(seen.empty());  // recorded, not run
  r->SetRecording(false);
  r->Replay();
  r->Replay();
  EXPECT_EQ(seen, (std::vector<float>{1.0f, 10.0f}));
  EXPECT_EQ(device, 100.0f);
  EXPECT_EQ(q.completed(), 2);
  EXPECT_TRUE(q.Drain(absl::Seconds(1)).ok());
  // Not recording: at once.
  ASSERT_TRUE(d->ToHost(nullptr, &host, &device, sizeof(float)).ok());
  EXPECT_EQ(host, 100.0f);
}

TEST(CudaDeviceOpsTest, WithoutADriverSaysWhy) {
  auto d = NewCudaDeviceOps();
  if (d.ok()) {
    GTEST_SKIP() << "this machine has a CUDA driver (the GPU run tests the "
                    "copies: python/device_route_test.py)";
  }
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(d.status().message().find("libcuda.so.1"), std::string::npos)
      << d.status();
}

}  // namespace
}  // namespace bnps::c_abi
