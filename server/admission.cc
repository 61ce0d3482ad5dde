#include "server/admission.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/generation.h"
#include "server/shard.h"

namespace bnps::server {
namespace {

absl::Status CheckJob(absl::string_view job, const std::string& ours) {
  if (job == ours) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "request for job '", job, "' reached a server of job '", ours, "'"));
}

}  // namespace

Admission& Admission::operator=(Admission&& other) noexcept {
  if (this != &other) {
    Release();
    worker_ = std::exchange(other.worker_, -1);
    rollback_mu_ = std::exchange(other.rollback_mu_, nullptr);
    claims_ = std::exchange(other.claims_, nullptr);
    claimed_ = std::exchange(other.claimed_, -1);
    claim_id_ = std::exchange(other.claim_id_, 0);
  }
  return *this;
}

void Admission::Release() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (rollback_mu_ != nullptr) rollback_mu_->ReaderUnlock();
  rollback_mu_ = nullptr;
  if (claims_ != nullptr) claims_->Release(claimed_, claim_id_);
  claims_ = nullptr;
  claimed_ = -1;
  claim_id_ = 0;
}

absl::StatusOr<Admission> Shard::Admit(const AdmissionRequest& request)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Admission admission;
  if (request.worker.has_value()) {
    const int worker = *request.worker;
    if (absl::Status s = CheckCaller(request.job.value_or(absl::string_view()),
                                     worker, request.caller);
        !s.ok()) {
      return s;
    }
    if (request.registered && !membership_.IsRegistered(worker)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", worker, " has not registered with shard ", options_.shard,
          ": it may not take part in BN before it registers"));
    }
    admission.worker_ = worker;
  } else if (request.job.has_value()) {
    if (absl::Status s = CheckJob(*request.job, options_.job); !s.ok()) return s;
  }
  for (const std::string& key : request.keys) {
    if (absl::Status s = CheckOwned(key); !s.ok()) return s;
  }
  if (request.connection.has_value() && request.caller != kAnyWorker) {
    const BnTransport transport = *request.connection;
    WorkerClaims& claims = bn_claims_[static_cast<int>(transport)];
    int64_t current;
    {
      absl::MutexLock lock(&gen_mu_);
      current = gen_.generation;
    }
    int64_t held = 0;
    const uint64_t id = claims.Claim(
        request.caller, request.connection_generation, current, &held);
    if (id == 0 && request.connection_generation < current) {
      // The worker's own connection of a past generation: whatever holds
      // the claim, this one could act in none, and the worker is told to
      // roll on, as each of its requests would be.
      return absl::AbortedError(absl::StrCat(
          "a BN connection of job generation ", request.connection_generation,
          " reached shard ", options_.shard, " in generation ", current, ": ",
          proto::kRollsBackText));
    }
    if (id == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", request.caller, " already has a live BN ",
          transport == BnTransport::kStream ? "stream" : "connection",
          " to shard ", options_.shard, " (per-worker tokens; generation ",
          held, ", this one's ", request.connection_generation,
          ", the shard's ", current, ")"));
    }
    admission.claims_ = &claims;
    admission.claimed_ = request.caller;
    admission.claim_id_ = id;
  }
  if (request.generation.has_value()) {
    // Checked under the lock a rollback takes exclusively, so that what the
    // admission lets through sees the generation it was checked against.
    rollback_mu_.ReaderLock();
    admission.rollback_mu_ = &rollback_mu_;
    if (absl::Status s = CheckGeneration(*request.generation); !s.ok()) {
      return s;  // `admission` lets go of the lock and the claim
    }
  }
  return admission;
}

absl::Status Shard::CheckCaller(absl::string_view job, int worker,
                                int caller) const {
  if (absl::Status s = CheckJob(job, options_.job); !s.ok()) return s;
  if (worker < 0 || worker >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " outside the job's [0, ", options_.num_workers, ")"));
  }
  if (caller != kAnyWorker && caller != worker) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the call's token is worker ", caller, "'s: it may not act as worker ",
        worker, " (per-worker tokens)"));
  }
  return absl::OkStatus();
}

absl::Status Shard::CheckGeneration(int64_t generation) const {
  absl::MutexLock lock(&gen_mu_);
  if (gen_.needs_rollback) {
    return absl::AbortedError(absl::StrCat(
        "shard ", options_.shard, " restarted from its checkpoint of step ",
        gen_.restored_step, ": ", proto::kRollsBackText,
        " to a step every server has"));
  }
  if (generation != gen_.generation) {
    return absl::AbortedError(absl::StrCat(
        "a call of job generation ", generation, " reached shard ",
        options_.shard, " in generation ", gen_.generation, ": ",
        proto::kRollsBackText, " (to step ", gen_.restored_step, ")"));
  }
  return absl::OkStatus();
}

}  // namespace bnps::server
