#include "server/policy.h"

#include "absl/strings/str_cat.h"

namespace bnps::server {

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
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown worker-loss action '", name, "'; expected fail or shrink"));
}

std::string WorkerLossName(WorkerLoss w) {
  return w == WorkerLoss::kFail ? "fail" : "shrink";
}

}  // namespace bnps::server
