#include "bn/moments.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/base/macros.h"
#include "absl/strings/str_cat.h"
#include "util/finite.h"

namespace bnps::bn {

Moments Moments::Empty(int64_t channels) {
  Moments m;
  m.mean.assign(channels, 0.0);
  m.m2.assign(channels, 0.0);
  return m;
}

absl::Status ValidateMoments(const Moments& m) {
  if (m.count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("moments: negative count ", m.count));
  }
  if (m.mean.empty() || m.mean.size() != m.m2.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("moments: mean has ", m.mean.size(), " channels and m2 ",
                     m.m2.size(), "; need the same non-zero number"));
  }
  // Every message of the BN protocol is checked here, so the common case is a
  // few vectorized scans (util/finite.h); the loop after them only names the
  // first bad channel.
  const size_t n = m.mean.size();
  const bool clean =
      m.count == 0
          ? util::FirstNonZero(m.mean) == n && util::FirstNonZero(m.m2) == n
          : util::FirstNonFinite(m.mean) == n && util::FirstNotFiniteNonNegative(m.m2) == n;
  if (clean) return absl::OkStatus();
  for (size_t c = 0; c < n; ++c) {
    if (!std::isfinite(m.mean[c]) || !std::isfinite(m.m2[c])) {
      return absl::InvalidArgumentError(
          absl::StrCat("moments: channel ", c, " is not finite (mean ",
                       m.mean[c], ", m2 ", m.m2[c], ")"));
    }
    if (m.m2[c] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("moments: channel ", c, " has negative m2 ", m.m2[c]));
    }
    if (m.count == 0 && (m.mean[c] != 0 || m.m2[c] != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "moments: channel ", c, " has values but the count is 0"));
    }
  }
  return absl::OkStatus();
}

void MergeInto(const Moments& part, Moments* acc) {
  if (part.count == 0) return;
  if (acc->count == 0) {
    *acc = part;
    return;
  }
  const double na = static_cast<double>(acc->count);
  const double nb = static_cast<double>(part.count);
  const double n = na + nb;
  const double wb = nb / n;
  const double cross = na * nb / n;
  for (size_t c = 0; c < acc->mean.size(); ++c) {
    const double delta = part.mean[c] - acc->mean[c];
    acc->mean[c] += delta * wb;
    acc->m2[c] += part.m2[c] + delta * delta * cross;
  }
  acc->count += part.count;
}

Moments MergeInOrder(absl::Span<const Moments* const> parts, int64_t channels) {
  Moments acc = Moments::Empty(channels);
  for (const Moments* part : parts) {
    if (part != nullptr) MergeInto(*part, &acc);
  }
  return acc;
}

absl::StatusOr<Moments> MergeMoments(absl::Span<const Moments> parts) {
  if (parts.empty()) {
    return absl::InvalidArgumentError("moments: nothing to merge");
  }
  const int64_t channels = parts[0].channels();
  std::vector<const Moments*> ordered;
  ordered.reserve(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (absl::Status s = ValidateMoments(parts[i]); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("part ", i, ": ", s.message()));
    }
    if (parts[i].channels() != channels) {
      return absl::InvalidArgumentError(
          absl::StrCat("part ", i, " has ", parts[i].channels(),
                       " channels, part 0 has ", channels));
    }
    ordered.push_back(&parts[i]);
  }
  return MergeInOrder(ordered, channels);
}

std::vector<double> BiasedVariance(const Moments& m) {
  std::vector<double> var(m.m2.size(), 0.0);
  if (m.count == 0) return var;
  for (size_t c = 0; c < var.size(); ++c) var[c] = m.m2[c] / m.count;
  return var;
}

absl::StatusOr<std::vector<double>> UnbiasedVariance(const Moments& m) {
  if (m.count < 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "unbiased variance needs at least 2 samples per channel, got ",
        m.count));
  }
  std::vector<double> var(m.m2.size());
  for (size_t c = 0; c < var.size(); ++c) var[c] = m.m2[c] / (m.count - 1);
  return var;
}

OrderedMerger::OrderedMerger(int num_slots, int64_t channels)
    : channels_(channels), slots_(num_slots) {}

absl::Status OrderedMerger::Add(int slot, Moments part) {
  if (slot < 0 || slot >= num_slots()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, " outside [0, ", num_slots(), ")"));
  }
  if (absl::Status s = ValidateMoments(part); !s.ok()) return s;
  if (part.channels() != channels_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot ", slot, ": ", part.channels(), " channels, expected ", channels_));
  }
  if (slots_[slot].has_value()) {
    return absl::AlreadyExistsError(absl::StrCat("slot ", slot, " already filled"));
  }
  slots_[slot] = std::move(part);
  ++num_filled_;
  return absl::OkStatus();
}

bool OrderedMerger::Has(int slot) const {
  return slot >= 0 && slot < num_slots() && slots_[slot].has_value();
}

Moments OrderedMerger::Merge() const {
  std::vector<const Moments*> parts;
  parts.reserve(slots_.size());
  for (const auto& slot : slots_) {
    parts.push_back(slot.has_value() ? &*slot : nullptr);
  }
  return MergeInOrder(parts, channels_);
}

RunningStats RunningStats::Initial(int64_t channels) {
  RunningStats stats;
  stats.mean.assign(channels, 0.0);
  stats.var.assign(channels, 1.0);
  return stats;
}

absl::Status UpdateRunningStats(const Moments& batch, double momentum,
                                RunningStats* stats) {
  if (!(momentum >= 0.0 && momentum <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("momentum ", momentum, " outside [0, 1]"));
  }
  if (absl::Status s = ValidateMoments(batch); !s.ok()) return s;
  if (stats->mean.size() != batch.mean.size() ||
      stats->var.size() != batch.mean.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "running stats have ", stats->mean.size(), " channels, batch has ",
        batch.mean.size()));
  }
  if (batch.count == 0) return absl::OkStatus();
  if (batch.count < 2) return UnbiasedVariance(batch).status();
  MixIntoRunningStats(batch, momentum, stats);
  return absl::OkStatus();
}

void MixIntoRunningStats(const Moments& batch, double momentum,
                         RunningStats* stats) {
  ABSL_ASSERT(batch.count >= 2 && batch.m2.size() == batch.mean.size() &&
              stats->mean.size() == batch.mean.size() &&
              stats->var.size() == batch.mean.size());
  // The unbiased variance channel by channel, as UnbiasedVariance computes
  // it (the same bits), without a vector of it.
  const double n1 = static_cast<double>(batch.count - 1);
  for (size_t c = 0; c < stats->mean.size(); ++c) {
    stats->mean[c] = (1.0 - momentum) * stats->mean[c] + momentum * batch.mean[c];
    stats->var[c] =
        (1.0 - momentum) * stats->var[c] + momentum * (batch.m2[c] / n1);
  }
}

}  // namespace bnps::bn
