#include "policy/policy.h"

#include <algorithm>

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

absl::StatusOr<Gradients> ParseGradients(absl::string_view name) {
  if (name == "sync") return Gradients::kSync;
  if (name == "async") return Gradients::kAsync;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown gradient mode '", name, "'; expected sync or async"));
}

std::string GradientsName(Gradients g) {
  return g == Gradients::kAsync ? "async" : "sync";
}

absl::StatusOr<JobPolicy> ResolvePolicy(absl::string_view policy,
                                        absl::string_view bn_policy,
                                        absl::string_view gradients) {
  JobPolicy out;
  if (!policy.empty()) {
    absl::StatusOr<Policy> p = ParsePolicy(policy);
    if (!p.ok()) return p.status();
    out = {*p, ShorthandGradients(*p)};
  }
  if (!bn_policy.empty()) {
    absl::StatusOr<Policy> bn = ParsePolicy(bn_policy);
    if (!bn.ok()) return bn.status();
    if (!policy.empty() && *bn != out.bn) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--policy=", policy, " means --bn_policy=", PolicyName(out.bn),
          ", not ", bn_policy, "; give --bn_policy and --gradients alone"));
    }
    out.bn = *bn;
  }
  if (!gradients.empty()) {
    absl::StatusOr<Gradients> g = ParseGradients(gradients);
    if (!g.ok()) return g.status();
    if (!policy.empty() && *g != out.gradients) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--policy=", policy, " means --gradients=",
          GradientsName(out.gradients), ", not ", gradients,
          "; give --bn_policy and --gradients alone"));
    }
    out.gradients = *g;
  }
  return out;
}

std::string JobPolicyName(const JobPolicy& p) {
  if (p.gradients == ShorthandGradients(p.bn)) return PolicyName(p.bn);
  return absl::StrCat("bn_policy=", PolicyName(p.bn),
                      ",gradients=", GradientsName(p.gradients));
}

std::vector<std::string> JobPolicyFlags(const JobPolicy& p) {
  if (p.gradients == ShorthandGradients(p.bn)) {
    return {absl::StrCat("--policy=", PolicyName(p.bn))};
  }
  return {absl::StrCat("--bn_policy=", PolicyName(p.bn)),
          absl::StrCat("--gradients=", GradientsName(p.gradients))};
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

absl::StatusOr<JobPolicy> FromConfig(const proto::JobConfig& c) {
  absl::StatusOr<Policy> bn = FromProto(c.policy());
  if (!bn.ok()) return bn.status();
  switch (c.gradients()) {
    case proto::GRADIENTS_UNSPECIFIED:
      return JobPolicy{*bn, ShorthandGradients(*bn)};
    case proto::GRADIENTS_SYNC:
      return JobPolicy{*bn, Gradients::kSync};
    case proto::GRADIENTS_ASYNC:
      return JobPolicy{*bn, Gradients::kAsync};
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown gradient mode ", static_cast<int>(c.gradients()),
          " on the wire"));
  }
}

void ToConfig(const JobPolicy& p, proto::JobConfig* c) {
  c->set_policy(ToProto(p.bn));
  if (p.gradients == ShorthandGradients(p.bn)) {
    c->clear_gradients();
  } else {
    c->set_gradients(p.gradients == Gradients::kAsync ? proto::GRADIENTS_ASYNC
                                                      : proto::GRADIENTS_SYNC);
  }
}

absl::Status CheckResizable(const JobPolicy& policy) {
  if (policy.bn == Policy::kSync && policy.gradients == Gradients::kSync) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("resizing needs --policy=sync (this job runs ",
                   JobPolicyName(policy), ")"));
}

absl::Status CheckBnStaleness(const JobPolicy& policy, int64_t bn_staleness) {
  if (bn_staleness == -1) return absl::OkStatus();
  if (bn_staleness < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bn_staleness=", bn_staleness,
        ": must be >= 0 (steps; leave it out for the bounded mode)"));
  }
  if (policy.bn != Policy::kAsync) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bn_staleness=", bn_staleness, " needs --bn_policy=async (this "
        "job runs BN policy ", PolicyName(policy.bn), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckBnGroups(const JobPolicy& policy, int group_size,
                           absl::Span<const int> worker_counts) {
  if (group_size == 0) return absl::OkStatus();
  if (group_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bn_group_size=", group_size, ": must be >= 1 (or 0: no groups)"));
  }
  if (!BnTrafficWhileTraining(policy.bn)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bn_group_size=", group_size, " needs --bn_policy=sync or async "
        "(this job runs BN policy ", PolicyName(policy.bn), "; local is a "
        "group of one, recal has no BN traffic while training)"));
  }
  for (int w : worker_counts) {
    if (w % group_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--bn_group_size=", group_size, " does not divide the job's ", w,
          " workers: groups are blocks of consecutive worker ids of equal "
          "size, so the group size must divide every worker count of the "
          "job (--num_workers and each --membership segment)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ParseBnGroupByHost(absl::string_view bn_group) {
  if (bn_group.empty()) return false;
  if (bn_group == "host") return true;
  return absl::InvalidArgumentError(absl::StrCat(
      "--bn_group='", bn_group, "': must be host (or empty: groups by "
      "--bn_group_size, or none)"));
}

absl::Status CheckBnGroupByHost(const JobPolicy& policy, int group_size,
                                absl::Span<const int> worker_counts) {
  if (!BnTrafficWhileTraining(policy.bn)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bn_group=host needs --bn_policy=sync or async (this job runs BN "
        "policy ", PolicyName(policy.bn), "; local is a group of one, recal "
        "has no BN traffic while training)"));
  }
  if (group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bn_group=host and --bn_group_size=", group_size, " both say how "
        "to form BN groups: give one"));
  }
  if (worker_counts.size() > 1) {
    return absl::InvalidArgumentError(
        "--bn_group=host needs a job that is not resized (no --membership "
        "with several counts): the groups are fixed once every worker "
        "registered");
  }
  return absl::OkStatus();
}

std::vector<int> BnGroupsOfHosts(absl::Span<const std::string> hosts) {
  std::vector<int> group;
  std::vector<std::string> seen;  // in order of their first worker
  for (const std::string& h : hosts) {
    auto it = std::find(seen.begin(), seen.end(), h);
    group.push_back(static_cast<int>(it - seen.begin()));
    if (it == seen.end()) seen.push_back(h);
  }
  return group;
}

std::vector<int> BnGroupOfWorkers(int group_size, int num_workers) {
  std::vector<int> group;
  if (group_size <= 0) return group;
  for (int w = 0; w < num_workers; ++w) group.push_back(w / group_size);
  return group;
}

}  // namespace bnps::policy
