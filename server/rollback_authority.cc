#include "server/rollback_authority.h"

#include "absl/strings/str_cat.h"
#include "proto/generation.h"
#include "security/worker_token.h"

namespace bnps::server {

namespace {

// The sealed messages; the job is length-prefixed, so no job name makes one
// message read as another's.
std::string JobPart(absl::string_view job) {
  return absl::StrCat(job.size(), ":", job);
}

std::string DecidedMessage(
    absl::string_view job, int64_t generation,
    const google::protobuf::RepeatedPtrField<proto::MembershipSegment>&
        membership) {
  std::string m =
      absl::StrCat("generation-decided:", JobPart(job), ":", generation, ":");
  for (const proto::MembershipSegment& s : membership) {
    absl::StrAppend(&m, s.from_step(), "/", s.num_workers(), ",");
  }
  return m;
}

std::string FailureMessage(absl::string_view job, int64_t generation) {
  return absl::StrCat("generation-failure:", JobPart(job), ":", generation);
}

// Rule 1's reasons that are not the caller's own (a failure the shard saw).
bool FailureHere(const RollbackGrounds& g) {
  return g.needs_rollback || g.failure_seen;
}

absl::Status Denied(int caller, int64_t generation, absl::string_view why) {
  return absl::PermissionDeniedError(absl::StrCat(
      "worker ", caller, "'s own token may not start generation ", generation,
      ": ", why, "; that takes the job token"));
}

}  // namespace

absl::Status CheckRollbackAuthority(absl::string_view key, absl::string_view job,
                                    int caller, const RollbackGrounds& g,
                                    const proto::RollbackRequest& req) {
  const int64_t to = req.generation();
  if (to < 0 || to > proto::kMaxGeneration) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rollback to generation ", to, ": generations run from 0 to ",
        proto::kMaxGeneration));
  }
  if (req.step() < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rollback to step ", req.step(), ": no such step"));
  }
  if (caller == security::TokenAuthenticator::kAnyWorker) {
    return absl::OkStatus();
  }
  if (req.resize_to() > caller + 1) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker ", caller, "'s own token may grow the job to ", caller + 1,
        " workers at most (its own place), not ", req.resize_to(),
        ": that takes the job token"));
  }
  const bool starts =
      to > g.generation || (to == g.generation && g.needs_rollback);
  if (!starts) return absl::OkStatus();
  if (!req.warrant().empty() &&
      security::SealMatches(key, DecidedMessage(job, to, req.membership()),
                            req.warrant())) {
    return absl::OkStatus();
  }
  if (req.membership_size() > 0) {
    return Denied(caller, to,
                  "a membership to adopt comes with shard 0's warrant for "
                  "it, and this request's does not hold");
  }
  const int64_t reach = g.needs_rollback ? kMaxGenerationsBehind : 1;
  if (to > g.generation + reach) {
    return Denied(caller, to,
                  absl::StrCat("this shard is in generation ", g.generation,
                               ", and a worker moves it ", reach,
                               " generation(s) on at most"));
  }
  const bool own_place =
      (req.resize_to() > 0 && req.resize_to() == caller + 1 &&
       g.caller_joins) ||
      (req.shrink_to() > 0 && req.shrink_to() == caller);
  if (FailureHere(g) || own_place) return absl::OkStatus();
  if (to == g.generation + 1 && !req.warrant().empty() &&
      security::SealMatches(key, FailureMessage(job, to), req.warrant())) {
    return absl::OkStatus();
  }
  return Denied(caller, to,
                "no shard saw a failure that calls for it (a restart from a "
                "checkpoint, a lost or replaced worker) and the request "
                "carries no shard's warrant");
}

std::string DecidedWarrant(
    absl::string_view key, absl::string_view job, int64_t generation,
    const google::protobuf::RepeatedPtrField<proto::MembershipSegment>&
        membership) {
  if (key.empty()) return "";
  return security::Seal(key, DecidedMessage(job, generation, membership));
}

std::string FailureWarrant(absl::string_view key, absl::string_view job,
                           const RollbackGrounds& g, int64_t next_generation) {
  if (key.empty() || !FailureHere(g) || next_generation <= g.generation ||
      next_generation > proto::kMaxGeneration) {
    return "";
  }
  const int64_t reach = g.needs_rollback ? kMaxGenerationsBehind : 1;
  if (next_generation > g.generation + reach) return "";
  return security::Seal(key, FailureMessage(job, next_generation));
}

}  // namespace bnps::server
