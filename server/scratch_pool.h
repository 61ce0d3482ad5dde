// Reusable float buffers for staging incoming tensors.
//
// A push is read into a staging buffer before the store validates and applies
// it as a whole. Allocating that buffer per call means fresh pages every time:
// for tensors of megabytes the kernel faults them in and zeroes them, which
// costs about as much as the copy itself. A ScratchPool keeps buffers that
// calls gave back and hands them out again, uninitialized.
//
// Buffers under kMinPooledBytes are plain allocations (malloc serves those
// from memory it already has). The pool keeps at most `max_kept_bytes` of idle
// buffers; a buffer given back beyond that is freed. Take prefers the smallest
// idle buffer that fits.
//
// Thread-safety: thread-safe. The pool must outlive every Buffer it handed out.

#ifndef BNPS_SERVER_SCRATCH_POOL_H_
#define BNPS_SERVER_SCRATCH_POOL_H_

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace bnps::server {

class ScratchPool {
 public:
  // A buffer of at least the size asked for; contents are unspecified. Goes
  // back to its pool when destroyed. Move-only.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& other) noexcept { *this = std::move(other); }
    Buffer& operator=(Buffer&& other) noexcept;
    ~Buffer() { Release(); }

    float* data() const { return data_.get(); }
    size_t capacity() const { return capacity_; }

   private:
    friend class ScratchPool;
    void Release();

    ScratchPool* pool_ = nullptr;
    std::unique_ptr<float[]> data_;
    size_t capacity_ = 0;
  };

  static constexpr size_t kMinPooledBytes = size_t{256} << 10;

  explicit ScratchPool(size_t max_kept_bytes) : max_kept_bytes_(max_kept_bytes) {}
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  // A buffer of at least `n` floats (n may be 0).
  Buffer Take(size_t n) ABSL_LOCKS_EXCLUDED(mu_);

  // Idle buffers and their bytes, for tests and status.
  size_t kept() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t kept_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // The capacity of the largest buffer Take ever handed out, in bytes.
  size_t largest_taken_bytes() const { return largest_taken_bytes_.load(); }

 private:
  void Give(std::unique_ptr<float[]> data, size_t capacity)
      ABSL_LOCKS_EXCLUDED(mu_);

  void NoteTaken(size_t capacity);

  const size_t max_kept_bytes_;
  std::atomic<size_t> largest_taken_bytes_{0};
  mutable absl::Mutex mu_;
  // Idle buffers by capacity (floats).
  std::multimap<size_t, std::unique_ptr<float[]>> idle_ ABSL_GUARDED_BY(mu_);
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_SCRATCH_POOL_H_
