// StagingBuffer: host memory that a device copies into and out of, kept for
// reuse across calls.
//
// The CUDA BN kernels move each layer's per-channel values (moments, sums,
// normalization parameters) between the device and the host on every BN
// exchange. From pageable memory such a copy is staged by the driver and
// cannot be asynchronous, and a fresh buffer per call costs an allocation per
// exchange. A StagingBuffer holds page-locked (pinned) memory from the
// allocator it is given (cudaMallocHost / cudaFreeHost on the GPU), grows to
// the largest size asked for and never shrinks, so a steady training loop
// allocates nothing after its first step.
//
// Thread-compatible: one owner (one stream) uses it at a time.

#ifndef BNPS_BN_STAGING_BUFFER_H_
#define BNPS_BN_STAGING_BUFFER_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace bnps::bn {

// How a StagingBuffer gets and returns memory. `allocate` returns a status
// and sets *out on success; `release` gets what `allocate` gave.
struct StagingAllocator {
  absl::Status (*allocate)(size_t bytes, void** out) = nullptr;
  void (*release)(void* data) = nullptr;
};

class StagingBuffer {
 public:
  explicit StagingBuffer(StagingAllocator allocator) : allocator_(allocator) {}
  ~StagingBuffer() { Reset(); }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  // Makes the buffer hold at least `count` values of T and returns them.
  // Reallocates only when it is smaller than that (the old contents are then
  // lost); on error the buffer is empty. REQUIRES: no copy into or out of the
  // buffer is in flight.
  template <typename T>
  absl::Status Reserve(size_t count, T** out) {
    const size_t bytes = count * sizeof(T);
    if (bytes > capacity_) {
      Reset();
      void* fresh = nullptr;
      if (absl::Status s = allocator_.allocate(bytes, &fresh); !s.ok()) {
        return s;
      }
      data_ = fresh;
      capacity_ = bytes;
      ++allocations_;
    }
    *out = static_cast<T*>(data_);
    return absl::OkStatus();
  }

  size_t capacity() const { return capacity_; }
  // How many times memory was allocated (for tests: a steady loop stops
  // allocating).
  int allocations() const { return allocations_; }

 private:
  void Reset() {
    if (data_ != nullptr) allocator_.release(data_);
    data_ = nullptr;
    capacity_ = 0;
  }

  const StagingAllocator allocator_;
  void* data_ = nullptr;
  size_t capacity_ = 0;
  int allocations_ = 0;
};

}  // namespace bnps::bn

#endif  // BNPS_BN_STAGING_BUFFER_H_
