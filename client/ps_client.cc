#include "client/ps_client.h"

#include <iterator>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

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

// PsClient's default ParameterPull: every key, pulled at once in StartPull.
class WholePull final : public ParameterPull {
 public:
  WholePull(absl::Status status, std::set<std::string> keys)
      : status_(std::move(status)), keys_(std::move(keys)) {}

  absl::Status Wait(const std::string& key) override {
    if (!status_.ok()) return status_;
    if (keys_.count(key) == 0) {
      return absl::NotFoundError(
          absl::StrCat("key '", key, "' is not part of this pull"));
    }
    return absl::OkStatus();
  }
  absl::Status Finish() override { return status_; }

 private:
  const absl::Status status_;
  const std::set<std::string> keys_;
};

}  // namespace

absl::Status CheckPullKeys(const std::vector<std::string>& keys) {
  if (keys.empty()) {
    return absl::InvalidArgumentError("StartPull: no keys");
  }
  std::set<absl::string_view> seen;
  for (const std::string& key : keys) {
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("StartPull: key '", key, "' is listed twice"));
    }
  }
  return absl::OkStatus();
}

void KeepOnly(const std::vector<std::string>& keys, Params* into) {
  const std::set<absl::string_view> want(keys.begin(), keys.end());
  for (auto it = into->begin(); it != into->end();) {
    it = want.count(it->first) ? std::next(it) : into->erase(it);
  }
  for (const std::string& key : keys) (*into)[key];
}

std::unique_ptr<ParameterPull> PsClient::StartPull(
    int64_t min_version, const std::vector<std::string>& keys, Params* into) {
  absl::Status s = CheckPullKeys(keys);
  if (s.ok()) {
    KeepOnly(keys, into);
    s = PullParametersInto(min_version, into);
  }
  return std::make_unique<WholePull>(
      std::move(s), std::set<std::string>(keys.begin(), keys.end()));
}

std::unique_ptr<GradientPush> PsClient::StartPush(int64_t step,
                                                  int64_t num_samples) {
  return std::make_unique<CollectedPush>(this, step, num_samples);
}

}  // namespace bnps::client
