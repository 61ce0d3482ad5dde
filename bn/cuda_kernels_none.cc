// bn/cuda_kernels.h in a build without CUDA (--config=cpu, e.g. the CPU
// container image): there is never a device, so every caller takes its CPU
// path, as it does on a machine without a GPU.

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "bn/cuda_kernels.h"

namespace bnps::bn {
namespace {

constexpr char kNoCuda[] = "this build has no CUDA (built with --config=cpu)";

}  // namespace

int CudaDeviceCount(std::string* why_none) {
  if (why_none != nullptr) *why_none = kNoCuda;
  return 0;
}

absl::Status SelectCudaDevice(int) {
  return absl::FailedPreconditionError(kNoCuda);
}

absl::StatusOr<std::unique_ptr<BnKernels>> NewCudaBnKernels(int) {
  return absl::FailedPreconditionError(kNoCuda);
}

DeviceBuffer::~DeviceBuffer() = default;

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(other.device_),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  device_ = other.device_;
  data_ = std::exchange(other.data_, nullptr);
  size_ = std::exchange(other.size_, 0);
  return *this;
}

void DeviceBuffer::Free() {}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(int, size_t) {
  return absl::FailedPreconditionError(kNoCuda);
}

absl::Status DeviceBuffer::CopyFromHost(const void*, size_t) {
  return absl::FailedPreconditionError(kNoCuda);
}

absl::Status DeviceBuffer::CopyToHost(void*, size_t) const {
  return absl::FailedPreconditionError(kNoCuda);
}

}  // namespace bnps::bn
