#include "client/internal/streaming_push.h"

#include <utility>

namespace bnps::client::internal {

StreamingPush::StreamingPush(BulkTransfer* bulk, int64_t step,
                             int64_t num_samples, int64_t min_bytes,
                             absl::Status refused)
    : bulk_(bulk),
      step_(step),
      num_samples_(num_samples),
      min_bytes_(min_bytes) {
  if (!refused.ok()) {
    refused_ = true;
    absl::MutexLock lock(&mu_);
    status_ = std::move(refused);
  }
}

StreamingPush::~StreamingPush() {
  if (!finished_) Abandon();
}

void StreamingPush::Abandon() {
  if (finished_) return;
  finished_ = true;
  pending_.clear();
  pending_bytes_ = 0;
  if (sender_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      queue_.clear();  // not sent yet: dropped
      closed_ = true;
    }
    sender_.join();
  }
}

void StreamingPush::Add(std::shared_ptr<const Params> part) {
  if (refused_ || finished_ || part == nullptr || part->empty()) return;
  for (const auto& [key, p] : *part) {
    pending_bytes_ += static_cast<int64_t>(p.values.size() * sizeof(float));
  }
  pending_.push_back(std::move(part));
  if (pending_bytes_ < min_bytes_) return;
  if (!sender_.joinable()) {
    sender_ = std::thread(&StreamingPush::SendLoop, this);
  }
  absl::MutexLock lock(&mu_);
  for (auto& p : pending_) queue_.push_back(std::move(p));
  pending_.clear();
  pending_bytes_ = 0;
}

absl::Status StreamingPush::Finish() {
  if (finished_) {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  finished_ = true;
  if (sender_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      for (auto& p : pending_) queue_.push_back(std::move(p));
      closed_ = true;
    }
    sender_.join();
  } else if (!pending_.empty()) {
    Send(std::move(pending_));  // nothing in flight: no thread needed
  }
  pending_.clear();
  absl::MutexLock lock(&mu_);
  return status_;
}

bool StreamingPush::HasWork() const { return closed_ || !queue_.empty(); }

void StreamingPush::SendLoop() {
  for (;;) {
    Parts parts;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &StreamingPush::HasWork));
      if (queue_.empty()) return;  // closed, all sent
      parts.swap(queue_);
    }
    Send(std::move(parts));
  }
}

void StreamingPush::Send(Parts parts) {
  std::vector<BulkTransfer::PushEntry> entries;
  for (const std::shared_ptr<const Params>& part : parts) {
    for (const auto& [key, p] : *part) {
      entries.push_back(BulkTransfer::PushEntry{&key, &p});
    }
  }
  // The parts stay alive while the messages reference them.
  auto owner = std::make_shared<Parts>(std::move(parts));
  absl::Status s = bulk_->PushEntries(step_, num_samples_, entries,
                                      std::shared_ptr<const void>(owner));
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = std::move(s);
  }
}

}  // namespace bnps::client::internal
