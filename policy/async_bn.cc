#include "policy/async_bn.h"

#include "staleness/clock_table.h"

namespace bnps::policy {

AsyncMerge MergeForAsync(const std::vector<LatestMoments>& latest,
                         const std::vector<bool>& live,
                         const std::vector<int>& group, int self, int64_t step,
                         int64_t staleness, int64_t channels) {
  AsyncMerge out;
  out.others = bn::Moments::Empty(channels);
  out.all = bn::Moments::Empty(channels);
  for (size_t w = 0; w < latest.size(); ++w) {
    const LatestMoments& l = latest[w];
    if (!live[w] || l.step < 0) continue;
    if (static_cast<int>(w) != self) {
      if (!staleness::Admissible(l.step, step, staleness)) continue;
      if (group.empty() || group[w] == group[self]) {
        bn::MergeInto(l.moments, &out.others);
        ++out.contributors;
        out.staleness.push_back(step - l.step);
      }
    }
    bn::MergeInto(l.moments, &out.all);
  }
  return out;
}

absl::StatusOr<bn::Moments> NormalizingMoments(const bn::Moments& own,
                               const bn::Moments& others) {
  return bn::MergeMoments({own, others});
}

}  // namespace bnps::policy
