// Who may start a job generation (proto's Rollback): the job's authority,
// never one worker's.
//
// A new generation restores a checkpoint on every shard, undoing every
// worker's steps since then, and may change the job's membership: it is the
// job's decision. The job token (the operator, the tools, every worker of a
// job without --per_worker_tokens) may start any generation up to
// proto::kMaxGeneration. A caller that proved only worker w's own token may
// start generation G on a shard in generation g only for a reason the shards
// themselves saw:
//  1. this shard saw it, and G is g + 1: the shard restarted from its
//     checkpoint (it needs a rollback; G may then be up to
//     kMaxGenerationsBehind above g, since a restarted shard may have missed
//     generations), or during g it lost a worker (its heartbeats, or another
//     shard's sealed news) or saw a worker's process replaced by a new one
//     (a restart under --on_worker_loss=wait); or w itself asks to join the
//     job (resize_to w + 1, and w is registered here at or above the job's
//     count) or to leave it (shrink_to w; the shard checks w is the highest);
//  2. another shard saw it: the request carries that shard's failure warrant
//     for G = g + 1 (StatusResponse.generation_warrant, made only by a shard
//     with a reason of kind 1);
//  3. shard 0 decided it: the request carries shard 0's decided warrant for
//     G and the membership the request asks this shard to adopt
//     (RollbackResponse.warrant). A worker's token may name a membership to
//     adopt only so.
// Why this rule: a worker can always cause what its own crash would (a
// restart is a failure the shards see), and it may take or give up its own
// place, but nothing more. A warrant is the job key's seal (security::Seal),
// which a worker cannot make, over one generation: once the shards are
// there it moves nothing, so it cannot be replayed to roll the job back
// again. The limits: a worker alone cannot roll the job back, resize it
// beyond its own place, push the generation, or impose a membership.
//
// A worker that finds a server unreachable forces a new generation; with
// only its own token that works once the shards saw a failure (the worker
// lost per their heartbeats, or a server restarted); a shorter partition
// that no shard noticed is refused (PERMISSION_DENIED, which ends that
// worker's recovery).
//
// Thread-safety: pure functions.

#ifndef BNPS_SERVER_ROLLBACK_AUTHORITY_H_
#define BNPS_SERVER_ROLLBACK_AUTHORITY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "proto/bnps.pb.h"

namespace bnps::server {

// How many generations a restarted shard may be behind the job: a worker's
// token may move such a shard at most this far at once.
inline constexpr int64_t kMaxGenerationsBehind = 1024;

// What a shard saw that calls for a new generation (rule 1 above).
struct RollbackGrounds {
  int64_t generation = 0;       // the shard's
  bool needs_rollback = false;  // restarted from its checkpoint
  bool failure_seen = false;    // lost or replaced a worker during it
  bool caller_joins = false;    // the caller, registered here, is above the count
};

// OK if `caller` (a worker id, or TokenAuthenticator::kAnyWorker for the
// job token) may make `req` of a shard with `grounds`, in job `job` whose
// key is `key`. Every caller: INVALID_ARGUMENT for a generation outside
// [0, proto::kMaxGeneration] or a step below -1. A worker's token:
// PERMISSION_DENIED, saying what it would take, unless the rule above
// allows it. A request that starts no generation here (an older one, or
// the one decided already) is left to the shard, which changes nothing.
absl::Status CheckRollbackAuthority(absl::string_view key, absl::string_view job,
                                    int caller, const RollbackGrounds& grounds,
                                    const proto::RollbackRequest& req);

// Shard 0's decided warrant (rule 3): it is in `generation` with
// `membership`. Empty without a key.
std::string DecidedWarrant(
    absl::string_view key, absl::string_view job, int64_t generation,
    const google::protobuf::RepeatedPtrField<proto::MembershipSegment>&
        membership);

// A shard's failure warrant for `next_generation` (rule 2): empty unless it
// has a reason of its own for it (rule 1's first kinds) and a key.
std::string FailureWarrant(absl::string_view key, absl::string_view job,
                           const RollbackGrounds& grounds,
                           int64_t next_generation);

}  // namespace bnps::server

#endif  // BNPS_SERVER_ROLLBACK_AUTHORITY_H_
