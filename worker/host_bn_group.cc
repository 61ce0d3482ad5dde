#include "worker/host_bn_group.h"

#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace bnps::worker {

struct HostBnGroup::Round {
  std::string layer;
  Phase phase = Phase::kForward;
  std::vector<std::optional<bn::Moments>> moments;     // forward, per replica
  std::vector<std::optional<bn::BackwardSums>> sums;   // backward, per replica
  int arrived = 0;
  int departed = 0;
  bool done = false;
  absl::Status status;
  bn::Moments merged_moments;
  bn::BackwardSums merged_sums;
};

class HostBnGroup::Member : public nn::BnExchange {
 public:
  Member(HostBnGroup* group, int replica) : group_(group), replica_(replica) {}

  absl::StatusOr<bn::Moments> Forward(const std::string& layer,
                                      const bn::Moments& local) override {
    return group_->RunRound(replica_, layer, Phase::kForward, local);
  }
  absl::StatusOr<bn::BackwardSums> Backward(
      const std::string& layer, const bn::BackwardSums& local) override {
    return group_->RunRound(replica_, layer, Phase::kBackward, local);
  }

 private:
  HostBnGroup* const group_;
  const int replica_;
};

namespace {

const char* PhaseName(bool forward) { return forward ? "forward" : "backward"; }

// The slots of a round for T, and how a round's result is kept.
template <typename T>
std::vector<std::optional<T>>& Slots(std::vector<std::optional<bn::Moments>>& m,
                                     std::vector<std::optional<bn::BackwardSums>>& s);
template <>
std::vector<std::optional<bn::Moments>>& Slots<bn::Moments>(
    std::vector<std::optional<bn::Moments>>& m,
    std::vector<std::optional<bn::BackwardSums>>&) {
  return m;
}
template <>
std::vector<std::optional<bn::BackwardSums>>& Slots<bn::BackwardSums>(
    std::vector<std::optional<bn::Moments>>&,
    std::vector<std::optional<bn::BackwardSums>>& s) {
  return s;
}

// The host's contribution: the replicas' parts in replica order.
absl::StatusOr<bn::Moments> Combine(
    const std::vector<std::optional<bn::Moments>>& parts) {
  const int64_t channels = parts.front()->channels();
  std::vector<const bn::Moments*> ordered;
  ordered.reserve(parts.size());
  for (const std::optional<bn::Moments>& part : parts) {
    if (absl::Status s = bn::ValidateMoments(*part); !s.ok()) return s;
    if (part->channels() != channels) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replicas disagree on the channels: ", channels, " and ",
          part->channels()));
    }
    ordered.push_back(&*part);
  }
  return bn::MergeInOrder(ordered, channels);
}

absl::StatusOr<bn::BackwardSums> Combine(
    const std::vector<std::optional<bn::BackwardSums>>& parts) {
  bn::BackwardSums acc = bn::BackwardSums::Zero(
      static_cast<int64_t>(parts.front()->sum_dy.size()));
  for (const std::optional<bn::BackwardSums>& part : parts) {
    if (absl::Status s = bn::AddSums(*part, &acc); !s.ok()) return s;
  }
  return acc;
}

absl::StatusOr<bn::Moments> Upstream(nn::BnExchange* up, const std::string& layer,
                                     const bn::Moments& host) {
  return up->Forward(layer, host);
}
absl::StatusOr<bn::BackwardSums> Upstream(nn::BnExchange* up,
                                          const std::string& layer,
                                          const bn::BackwardSums& host) {
  return up->Backward(layer, host);
}

}  // namespace

HostBnGroup::HostBnGroup(int replicas, nn::BnExchange* upstream)
    : upstream_(upstream) {
  for (int i = 0; i < replicas; ++i) {
    members_.push_back(std::make_unique<Member>(this, i));
  }
}

HostBnGroup::~HostBnGroup() = default;

nn::BnExchange* HostBnGroup::member(int i) { return members_[i].get(); }

void HostBnGroup::Abort(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) {
    aborted_ = absl::CancelledError(
        status.ok() ? std::string("another replica stopped")
                    : absl::StrCat("another replica stopped: ", status.message()));
  }
}

void HostBnGroup::Reset() {
  absl::MutexLock lock(&mu_);
  aborted_ = absl::OkStatus();
  round_.reset();
}

template <typename T>
absl::StatusOr<T> HostBnGroup::RunRound(int replica, const std::string& layer,
                                        Phase phase, const T& local) {
  const int k = replicas();
  const bool forward = phase == Phase::kForward;
  absl::MutexLock lock(&mu_);
  // Wait for a round this replica can join: none open (the last one was
  // collected by everyone), or one it has not contributed to yet.
  auto can_join = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!aborted_.ok() || round_ == nullptr) return true;
    return !round_->done &&
           !Slots<T>(round_->moments, round_->sums)[replica].has_value();
  };
  mu_.Await(absl::Condition(&can_join));
  if (!aborted_.ok()) return aborted_;
  if (round_ == nullptr) {
    round_ = std::make_unique<Round>();
    round_->layer = layer;
    round_->phase = phase;
    round_->moments.resize(forward ? k : 0);
    round_->sums.resize(forward ? 0 : k);
  } else if (round_->layer != layer || round_->phase != phase) {
    aborted_ = absl::FailedPreconditionError(absl::StrCat(
        "replica ", replica, " exchanges BN layer ", layer, " (",
        PhaseName(forward), ") while the others exchange ", round_->layer,
        " (", PhaseName(round_->phase == Phase::kForward),
        "): replicas must run the same model"));
    return aborted_;
  }
  Round* const round = round_.get();
  Slots<T>(round->moments, round->sums)[replica] = local;
  if (++round->arrived == k) {
    // This replica completes the round: combine in replica order, cross to
    // upstream once. The others wait on `done`, so upstream is called alone.
    absl::StatusOr<T> answer = Combine(Slots<T>(round->moments, round->sums));
    if (answer.ok()) {
      mu_.Unlock();
      answer = Upstream(upstream_, layer, *answer);
      mu_.Lock();
    }
    round->status = answer.status();
    if (answer.ok()) {
      if constexpr (std::is_same_v<T, bn::Moments>) {
        round->merged_moments = *std::move(answer);
      } else {
        round->merged_sums = *std::move(answer);
      }
    }
    round->done = true;
  } else {
    auto finished = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return round->done || !aborted_.ok();
    };
    mu_.Await(absl::Condition(&finished));
    if (!round->done) return aborted_;
  }
  absl::StatusOr<T> result = absl::UnknownError("unset");
  if (!round->status.ok()) {
    result = round->status;
  } else if constexpr (std::is_same_v<T, bn::Moments>) {
    result = round->merged_moments;
  } else {
    result = round->merged_sums;
  }
  if (++round->departed == k) round_.reset();
  return result;
}

}  // namespace bnps::worker
