// Job generations on the wire (proto/bnps.proto, "Job generations"): the
// metadata key a call carries its generation in, and how a refusal for
// being of another generation is told apart from other ABORTED answers.

#ifndef BNPS_PROTO_GENERATION_H_
#define BNPS_PROTO_GENERATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/match.h"

namespace bnps::proto {

inline constexpr char kGenerationMetadataKey[] = "bnps-generation";
// The highest generation a job may reach: a generation from the wire above
// it is refused, so that the next one (newest + 1) never overflows. A job
// rolls back a few times a day at most; 2^53 is never reached honestly.
inline constexpr int64_t kMaxGeneration = int64_t{1} << 53;
// Every such refusal's message contains this.
inline constexpr char kRollsBackText[] = "the job rolls back";

// ABORTED, containing kRollsBackText: the job rolls back to a checkpoint.
inline bool IsRollback(const absl::Status& s) {
  return absl::IsAborted(s) && absl::StrContains(s.message(), kRollsBackText);
}

// The end of a job (proto/bnps.proto, Leave): a registration refused
// because the job is complete, or because this worker id finished it
// already, is FAILED_PRECONDITION containing this. A worker restarted after
// its id finished (say, killed on its way out) has nothing left to do.
inline constexpr char kFinishedText[] = "finished the job";

// FAILED_PRECONDITION, containing kFinishedText.
inline bool IsFinished(const absl::Status& s) {
  return absl::IsFailedPrecondition(s) &&
         absl::StrContains(s.message(), kFinishedText);
}

}  // namespace bnps::proto

#endif  // BNPS_PROTO_GENERATION_H_
