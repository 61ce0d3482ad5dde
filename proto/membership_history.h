// The job's worker count as a function of the step: its membership history.
//
// A sync job may grow or shrink between steps. Its history is a list of
// segments (from_step, W), the first from step 0 with the job's
// --num_workers; segment i holds for the steps [from_step_i,
// from_step_{i+1}). Worker ids stay dense: the workers of step s are
// 0..WorkersAt(s)-1, so a grow adds the top ids and a shrink removes them.
// The step barriers (gradients, BN) of step s wait for WorkersAt(s) workers,
// and the workers' data rule (worker/data/elastic_shard.h) reads the same
// counts, which is what makes a resize at step N equal a restart at N with
// the new count.
//
// Text form (flags, logs, bnps_status): "0:2,10:4,20:2", segments in step
// order, "FROM_STEP:W" each. On the wire, JobConfig.membership (empty for a
// job of one segment: its num_workers throughout).
//
// Servers and workers read the same history: the servers' barriers and the
// workers' data rule (worker/data/elastic_shard.h) both call WorkersAt.
//
// Errors: INVALID_ARGUMENT for a malformed history (no segments, the first
// not from step 0, steps not increasing, W < 1 or above kMaxWorkers);
// FAILED_PRECONDITION for a resize the job cannot take (a step before one
// it already fixed).
// Thread-safety: a value type; not thread-safe (its owner locks).

#ifndef BNPS_PROTO_MEMBERSHIP_HISTORY_H_
#define BNPS_PROTO_MEMBERSHIP_HISTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/bnps.pb.h"

namespace bnps::proto {

class MembershipHistory {
 public:
  // The most workers a step may have (ids are array indices on every shard).
  static constexpr int kMaxWorkers = 1 << 16;

  struct Segment {
    int64_t from_step = 0;
    int num_workers = 1;
    bool operator==(const Segment& o) const {
      return from_step == o.from_step && num_workers == o.num_workers;
    }
  };

  // One segment: `num_workers` from step 0. REQUIRES: 1 <= num_workers <=
  // kMaxWorkers.
  explicit MembershipHistory(int num_workers);
  // A history of `segments`; INVALID_ARGUMENT unless well formed (above).
  static absl::StatusOr<MembershipHistory> Create(std::vector<Segment> segments);
  // Parses the text form; INVALID_ARGUMENT naming what is wrong.
  static absl::StatusOr<MembershipHistory> Parse(absl::string_view text);

  // The workers of `step` (a negative step counts as 0).
  int WorkersAt(int64_t step) const;
  // The job's first count (segment 0): the count its data epochs are cut for.
  int base_workers() const { return segments_.front().num_workers; }
  // The largest count of any segment: the ids the job ever has.
  int max_workers() const;
  // The largest count of the steps from `step` on.
  int MaxWorkersFrom(int64_t step) const;
  const std::vector<Segment>& segments() const { return segments_; }

  // Resizes the job to `num_workers` from step `from_step` on. A resize at
  // the step of the last segment replaces that segment's count (a second
  // request before the step began); a count equal to the one in force there
  // adds nothing. FAILED_PRECONDITION for a step before the last segment's,
  // or `num_workers` out of range (INVALID_ARGUMENT).
  absl::Status ResizeAt(int64_t from_step, int num_workers);

  // The segments from `step` on, as a restart from a checkpoint of `step`
  // continues them with `num_workers`: the history up to `step` stays (it is
  // what the data rule of later steps reads) and a segment (step,
  // num_workers) follows unless that count is already in force. Errors as
  // ResizeAt.
  absl::StatusOr<MembershipHistory> RestartedAt(int64_t step,
                                                int num_workers) const;

  // "0:2,10:4,20:2".
  std::string ToString() const;

  // The history `config` carries: its membership, or num_workers from step
  // 0 when it has none. INVALID_ARGUMENT for a malformed one, or a count
  // above config.num_workers (the job's ids).
  static absl::StatusOr<MembershipHistory> FromConfig(const JobConfig& config);
  // The history `segments` give a job of `num_workers` ids (num_workers
  // from step 0 when empty); errors as FromConfig.
  static absl::StatusOr<MembershipHistory> FromSegments(
      int num_workers,
      const google::protobuf::RepeatedPtrField<MembershipSegment>& segments);
  // Writes the history into config->membership; nothing for one segment.
  void ToConfig(JobConfig* config) const;
  // Every segment, even one.
  void ToSegments(
      google::protobuf::RepeatedPtrField<MembershipSegment>* segments) const;

  // Whether both histories give every step before `step` the same count.
  bool SameBefore(const MembershipHistory& o, int64_t step) const;

  bool operator==(const MembershipHistory& o) const {
    return segments_ == o.segments_;
  }

 private:
  MembershipHistory() = default;
  std::vector<Segment> segments_;
};

}  // namespace bnps::proto

#endif  // BNPS_PROTO_MEMBERSHIP_HISTORY_H_
