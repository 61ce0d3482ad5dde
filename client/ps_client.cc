#include "client/ps_client.h"

#include <utility>
#include <vector>

namespace bnps::client {
namespace {

// PsClient's default GradientPush: the parts, pushed together in Finish.
class CollectedPush final : public GradientPush {
 public:
  CollectedPush(PsClient* client, int64_t step, int64_t num_samples)
      : client_(client), step_(step), num_samples_(num_samples) {}
  ~CollectedPush() override = default;  // unfinished: nothing was sent

  void Add(std::shared_ptr<const Params> part) override {
    if (part != nullptr) parts_.push_back(std::move(part));
  }

  void Abandon() override {
    finished_ = true;
    parts_.clear();
  }

  absl::Status Finish() override {
    finished_ = true;
    if (parts_.size() == 1) {
      return client_->PushGradients(step_, num_samples_, std::move(parts_[0]));
    }
    auto all = std::make_shared<Params>();
    for (const std::shared_ptr<const Params>& part : parts_) {
      all->insert(part->begin(), part->end());
    }
    parts_.clear();
    return client_->PushGradients(step_, num_samples_,
                                  std::shared_ptr<const Params>(all));
  }

 private:
  PsClient* const client_;  // not owned
  const int64_t step_;
  const int64_t num_samples_;
  std::vector<std::shared_ptr<const Params>> parts_;
  bool finished_ = false;
};

}  // namespace

std::unique_ptr<GradientPush> PsClient::StartPush(int64_t step,
                                                  int64_t num_samples) {
  return std::make_unique<CollectedPush>(this, step, num_samples);
}

}  // namespace bnps::client
