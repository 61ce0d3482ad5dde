#include "server/scratch_pool.h"

#include <utility>

namespace bnps::server {

ScratchPool::Buffer& ScratchPool::Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::move(other.data_);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void ScratchPool::Buffer::Release() {
  if (pool_ != nullptr && data_ != nullptr) {
    pool_->Give(std::move(data_), capacity_);
  }
  pool_ = nullptr;
  data_.reset();
  capacity_ = 0;
}

ScratchPool::Buffer ScratchPool::Take(size_t n) {
  Buffer b;
  if (n * sizeof(float) >= kMinPooledBytes) {
    b.pool_ = this;
    absl::MutexLock lock(&mu_);
    auto it = idle_.lower_bound(n);
    if (it != idle_.end()) {
      b.capacity_ = it->first;
      b.data_ = std::move(it->second);
      idle_bytes_ -= it->first * sizeof(float);
      idle_.erase(it);
      NoteTaken(b.capacity_);
      return b;
    }
  }
  // Default-initialized: no zeroing of memory the caller overwrites anyway.
  b.data_.reset(new float[n == 0 ? 1 : n]);
  b.capacity_ = n;
  NoteTaken(n);
  return b;
}

void ScratchPool::NoteTaken(size_t capacity) {
  const size_t bytes = capacity * sizeof(float);
  size_t seen = largest_taken_bytes_.load(std::memory_order_relaxed);
  while (bytes > seen && !largest_taken_bytes_.compare_exchange_weak(
                             seen, bytes, std::memory_order_relaxed)) {
  }
}

void ScratchPool::Give(std::unique_ptr<float[]> data, size_t capacity) {
  const size_t bytes = capacity * sizeof(float);
  absl::MutexLock lock(&mu_);
  // Beyond the limit the buffer is freed on return, after the unlock.
  if (idle_bytes_ + bytes > max_kept_bytes_) return;
  idle_bytes_ += bytes;
  idle_.emplace(capacity, std::move(data));
}

size_t ScratchPool::kept() const {
  absl::MutexLock lock(&mu_);
  return idle_.size();
}

size_t ScratchPool::kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return idle_bytes_;
}

}  // namespace bnps::server
