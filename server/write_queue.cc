#include "server/write_queue.h"

#include <utility>

namespace bnps::server {

const grpc::ByteBuffer* WriteQueue::Push(grpc::ByteBuffer m, int64_t* cut_at) {
  if (broken_) return nullptr;
  const int64_t n = static_cast<int64_t>(m.Length());
  if (held_ + n > cap_ || (budget_ != nullptr && !budget_->TryCharge(n))) {
    if (cut_at != nullptr) *cut_at = held_ + n;
    broken_ = true;
    DropQueued();
    return nullptr;
  }
  held_ += n;
  queue_.push_back(std::move(m));
  if (writing_) return nullptr;
  writing_ = true;
  return &queue_.front();
}

const grpc::ByteBuffer* WriteQueue::WriteDone(bool ok) {
  const int64_t n = static_cast<int64_t>(queue_.front().Length());
  held_ -= n;
  if (budget_ != nullptr) budget_->Release(n);
  queue_.pop_front();
  writing_ = false;
  if (!ok) {
    broken_ = true;
    DropQueued();
  }
  if (queue_.empty()) return nullptr;
  writing_ = true;
  return &queue_.front();
}

void WriteQueue::Close() {
  writing_ = false;
  DropQueued();
}

void WriteQueue::PopBack() {
  const int64_t n = static_cast<int64_t>(queue_.back().Length());
  held_ -= n;
  if (budget_ != nullptr) budget_->Release(n);
  queue_.pop_back();
}

void WriteQueue::DropQueued() {
  while (queue_.size() > (writing_ ? 1u : 0u)) PopBack();
}

}  // namespace bnps::server
