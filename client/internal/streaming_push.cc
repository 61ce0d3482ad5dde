#include "client/internal/streaming_push.h"

#include <utility>

namespace bnps::client::internal {

StreamingPush::StreamingPush(BulkTransfer* bulk, int64_t step,
                             int64_t num_samples, absl::Status refused)
    : bulk_(bulk), step_(step), num_samples_(num_samples) {
  if (!refused.ok()) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(refused);
    closed_ = true;
    return;
  }
  sender_ = std::thread(&StreamingPush::SendLoop, this);
}

StreamingPush::~StreamingPush() {
  if (!finished_) Finish().IgnoreError();
}

void StreamingPush::Add(std::shared_ptr<const Params> part) {
  if (part == nullptr || part->empty()) return;
  absl::MutexLock lock(&mu_);
  if (closed_) return;  // refused: nothing is sent
  queue_.push_back(std::move(part));
}

absl::Status StreamingPush::Finish() {
  finished_ = true;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  if (sender_.joinable()) sender_.join();
  absl::MutexLock lock(&mu_);
  return status_;
}

bool StreamingPush::HasWork() const { return closed_ || !queue_.empty(); }

void StreamingPush::SendLoop() {
  for (;;) {
    std::vector<std::shared_ptr<const Params>> parts;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &StreamingPush::HasWork));
      if (queue_.empty()) return;  // closed, all sent
      parts.swap(queue_);
    }
    std::vector<BulkTransfer::PushEntry> entries;
    for (const std::shared_ptr<const Params>& part : parts) {
      for (const auto& [key, p] : *part) {
        entries.push_back(BulkTransfer::PushEntry{&key, &p});
      }
    }
    // The parts stay alive while the messages reference them.
    auto owner =
        std::make_shared<std::vector<std::shared_ptr<const Params>>>(
            std::move(parts));
    absl::Status s = bulk_->PushEntries(step_, num_samples_, entries,
                                        std::shared_ptr<const void>(owner));
    if (!s.ok()) {
      absl::MutexLock lock(&mu_);
      if (status_.ok()) status_ = std::move(s);
    }
  }
}

}  // namespace bnps::client::internal
