// The C ABI's stream queue handle (bnps_stream_queue), shared by its
// stream-ordered exchanges (bnps_c_queue.cc) and its device layer passes
// (bnps_c_device_pass.cc). Not part of the ABI.

#ifndef BNPS_PYTHON_NATIVE_BNPS_C_QUEUE_H_
#define BNPS_PYTHON_NATIVE_BNPS_C_QUEUE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "client/stream_exchanges.h"
#include "python/native/bnps_c_device.h"

struct bnps_stream_queue {
  bnps_stream_queue(std::unique_ptr<bnps::client::HostFuncLauncher> launcher,
                    absl::StatusOr<std::unique_ptr<bnps::c_abi::DeviceOps>> d)
      : exchanges(std::move(launcher)), device(std::move(d)) {}
  bnps::client::StreamExchanges exchanges;
  // The device passes' copies and buffers, or why there are none (a driver
  // without them: the queued exchanges still work).
  absl::StatusOr<std::unique_ptr<bnps::c_abi::DeviceOps>> device;
  // Times a frontend's layer waited for the device (bnps_stream_queue_
  // note_wait): the host reading device values outside the queue.
  std::atomic<int64_t> layer_waits{0};
  // A recording queue's recorder (bnps_stream_queue_new_recording).
  std::shared_ptr<bnps::c_abi::Recorder> recorder;
};

#endif  // BNPS_PYTHON_NATIVE_BNPS_C_QUEUE_H_
