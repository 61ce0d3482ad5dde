#include "policy/policy.h"

#include "absl/strings/str_cat.h"

namespace bnps::policy {

absl::StatusOr<Policy> ParsePolicy(absl::string_view name) {
  if (name == "sync") return Policy::kSync;
  if (name == "async") return Policy::kAsync;
  if (name == "recal") return Policy::kRecal;
  if (name == "local") return Policy::kLocal;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown policy '", name, "'; expected sync, async, recal or local"));
}

std::string PolicyName(Policy p) {
  switch (p) {
    case Policy::kSync: return "sync";
    case Policy::kAsync: return "async";
    case Policy::kRecal: return "recal";
    case Policy::kLocal: return "local";
  }
  return "?";
}

absl::StatusOr<WorkerLoss> ParseWorkerLoss(absl::string_view name) {
  if (name == "fail") return WorkerLoss::kFail;
  if (name == "shrink") return WorkerLoss::kShrink;
  if (name == "wait") return WorkerLoss::kWait;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown worker-loss action '", name, "'; expected fail, shrink or wait"));
}

std::string WorkerLossName(WorkerLoss w) {
  switch (w) {
    case WorkerLoss::kFail: return "fail";
    case WorkerLoss::kShrink: return "shrink";
    case WorkerLoss::kWait: return "wait";
  }
  return "?";
}

proto::Policy ToProto(Policy p) {
  switch (p) {
    case Policy::kSync: return proto::POLICY_SYNC;
    case Policy::kAsync: return proto::POLICY_ASYNC;
    case Policy::kRecal: return proto::POLICY_RECAL;
    case Policy::kLocal: return proto::POLICY_LOCAL;
  }
  return proto::POLICY_UNSPECIFIED;
}

absl::StatusOr<Policy> FromProto(proto::Policy p) {
  switch (p) {
    case proto::POLICY_SYNC: return Policy::kSync;
    case proto::POLICY_ASYNC: return Policy::kAsync;
    case proto::POLICY_RECAL: return Policy::kRecal;
    case proto::POLICY_LOCAL: return Policy::kLocal;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown policy ", static_cast<int>(p), " on the wire"));
  }
}

proto::WorkerLossAction ToProto(WorkerLoss w) {
  switch (w) {
    case WorkerLoss::kShrink: return proto::WORKER_LOSS_SHRINK;
    case WorkerLoss::kWait: return proto::WORKER_LOSS_WAIT;
    case WorkerLoss::kFail: break;
  }
  return proto::WORKER_LOSS_FAIL;
}

}  // namespace bnps::policy
