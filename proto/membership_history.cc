#include "proto/membership_history.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace bnps::proto {

MembershipHistory::MembershipHistory(int num_workers)
    : segments_({Segment{0, num_workers}}) {}

absl::StatusOr<MembershipHistory> MembershipHistory::Create(
    std::vector<Segment> segments) {
  if (segments.empty()) {
    return absl::InvalidArgumentError("a membership history has no segments");
  }
  if (segments.front().from_step != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the first membership segment starts at step ",
                     segments.front().from_step, ", not 0"));
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.num_workers < 1 || s.num_workers > kMaxWorkers) {
      return absl::InvalidArgumentError(
          absl::StrCat("membership segment ", s.from_step, ":", s.num_workers,
                       ": the count must be in [1, ", kMaxWorkers, "]"));
    }
    if (i > 0 && s.from_step <= segments[i - 1].from_step) {
      return absl::InvalidArgumentError(absl::StrCat(
          "membership segments must start at increasing steps (", s.from_step,
          " follows ", segments[i - 1].from_step, ")"));
    }
  }
  MembershipHistory h;
  h.segments_ = std::move(segments);
  return h;
}

absl::StatusOr<MembershipHistory> MembershipHistory::Parse(
    absl::string_view text) {
  std::vector<Segment> segments;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> f = absl::StrSplit(part, ':');
    Segment s;
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &s.from_step) ||
        !absl::SimpleAtoi(f[1], &s.num_workers)) {
      return absl::InvalidArgumentError(
          absl::StrCat("membership history '", text, "': '", part,
                       "' is not FROM_STEP:WORKERS"));
    }
    segments.push_back(s);
  }
  return Create(std::move(segments));
}

int MembershipHistory::WorkersAt(int64_t step) const {
  // The last segment that starts at or before `step`.
  auto it = std::upper_bound(
      segments_.begin(), segments_.end(), step,
      [](int64_t s, const Segment& seg) { return s < seg.from_step; });
  return it == segments_.begin() ? segments_.front().num_workers
                                 : std::prev(it)->num_workers;
}

int MembershipHistory::max_workers() const {
  int m = 0;
  for (const Segment& s : segments_) m = std::max(m, s.num_workers);
  return m;
}

int MembershipHistory::MaxWorkersFrom(int64_t step) const {
  int m = WorkersAt(step);
  for (const Segment& s : segments_) {
    if (s.from_step > step) m = std::max(m, s.num_workers);
  }
  return m;
}

absl::Status MembershipHistory::ResizeAt(int64_t from_step, int num_workers) {
  if (num_workers < 1 || num_workers > kMaxWorkers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a job resized to ", num_workers, " workers: the count must be in [1, ",
        kMaxWorkers, "]"));
  }
  Segment& last = segments_.back();
  if (from_step < last.from_step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a resize to ", num_workers, " workers from step ", from_step,
        ": the job's membership is fixed up to step ", last.from_step, " (",
        ToString(), ")"));
  }
  if (from_step == last.from_step) {  // before the step began: replace
    last.num_workers = num_workers;
    // The segment may now repeat the one before it: merge them.
    if (segments_.size() > 1 &&
        segments_[segments_.size() - 2].num_workers == num_workers) {
      segments_.pop_back();
    }
    return absl::OkStatus();
  }
  if (last.num_workers == num_workers) return absl::OkStatus();
  segments_.push_back(Segment{from_step, num_workers});
  return absl::OkStatus();
}

absl::StatusOr<MembershipHistory> MembershipHistory::RestartedAt(
    int64_t step, int num_workers) const {
  MembershipHistory h;
  for (const Segment& s : segments_) {
    if (s.from_step <= step) h.segments_.push_back(s);
  }
  if (absl::Status s = h.ResizeAt(step, num_workers); !s.ok()) return s;
  return h;
}

std::string MembershipHistory::ToString() const {
  return absl::StrJoin(segments_, ",", [](std::string* out, const Segment& s) {
    absl::StrAppend(out, s.from_step, ":", s.num_workers);
  });
}

absl::StatusOr<MembershipHistory> MembershipHistory::FromConfig(
    const JobConfig& config) {
  return FromSegments(config.num_workers(), config.membership());
}

absl::StatusOr<MembershipHistory> MembershipHistory::FromSegments(
    int num_workers,
    const google::protobuf::RepeatedPtrField<MembershipSegment>& segments) {
  if (segments.empty()) {
    if (num_workers < 1 || num_workers > kMaxWorkers) {
      return absl::InvalidArgumentError(
          absl::StrCat("the job's config has ", num_workers, " workers"));
    }
    return MembershipHistory(num_workers);
  }
  std::vector<Segment> out;
  for (const MembershipSegment& m : segments) {
    out.push_back(Segment{m.from_step(), m.num_workers()});
  }
  absl::StatusOr<MembershipHistory> h = Create(std::move(out));
  if (h.ok() && h->max_workers() > num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job's membership ", h->ToString(), " has more workers than its ",
        num_workers, " ids"));
  }
  return h;
}

void MembershipHistory::ToConfig(JobConfig* config) const {
  config->clear_membership();
  if (segments_.size() == 1 &&
      segments_.front().num_workers == config->num_workers()) {
    return;
  }
  ToSegments(config->mutable_membership());
}

void MembershipHistory::ToSegments(
    google::protobuf::RepeatedPtrField<MembershipSegment>* segments) const {
  segments->Clear();
  for (const Segment& s : segments_) {
    MembershipSegment* m = segments->Add();
    m->set_from_step(s.from_step);
    m->set_num_workers(s.num_workers);
  }
}

bool MembershipHistory::SameBefore(const MembershipHistory& o,
                                   int64_t step) const {
  // The counts change only at segment starts: compare there and at 0.
  for (const MembershipHistory* h : {this, &o}) {
    for (const Segment& s : h->segments_) {
      if (s.from_step < step && WorkersAt(s.from_step) != o.WorkersAt(s.from_step)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace bnps::proto
