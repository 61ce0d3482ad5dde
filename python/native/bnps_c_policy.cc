// bnps_resolve_policy (python/native/bnps_c.h): policy::ResolvePolicy as
// JSON, translation only. Its own library (//python:bnps_c_policy) so that
// the C++ test and frontends without a connection link it alone.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "policy/policy.h"
#include "python/native/bnps_c.h"
#include "python/native/bnps_c_status.h"
#include "util/json_string.h"

namespace {

using ::bnps::util::JsonString;

std::string JsonList(const std::vector<std::string>& items) {
  return absl::StrCat(
      "[",
      absl::StrJoin(items, ", ",
                    [](std::string* out, const std::string& s) {
                      out->append(JsonString(s));
                    }),
      "]");
}

std::string ResolvedJson(const bnps::policy::JobPolicy& p) {
  namespace policy = ::bnps::policy;
  std::vector<std::string> policies, modes;
  for (policy::Policy q : policy::kPolicies) {
    policies.push_back(policy::PolicyName(q));
  }
  for (policy::Gradients g : policy::kGradientModes) {
    modes.push_back(policy::GradientsName(g));
  }
  return absl::StrCat(
      "{\"bn_policy\": ", JsonString(policy::PolicyName(p.bn)),
      ", \"gradients\": ", JsonString(policy::GradientsName(p.gradients)),
      ", \"name\": ", JsonString(policy::JobPolicyName(p)),
      ", \"flags\": ", JsonList(policy::JobPolicyFlags(p)),
      ", \"policies\": ", JsonList(policies),
      ", \"gradient_modes\": ", JsonList(modes), "}");
}

}  // namespace

int bnps_resolve_policy(const char* policy, const char* bn_policy,
                        const char* gradients, char* json, size_t len,
                        char* err, size_t err_len) {
  using ::bnps::c_abi::Str;
  absl::StatusOr<bnps::policy::JobPolicy> p = bnps::policy::ResolvePolicy(
      Str(policy), Str(bn_policy), Str(gradients));
  BNPS_RETURN_IF_ERROR(p.status());
  const std::string out = ResolvedJson(*p);
  if (json == nullptr || out.size() + 1 > len) {
    BNPS_RETURN_IF_ERROR(absl::ResourceExhaustedError(
        absl::StrCat("the resolved policy needs ", out.size() + 1, " bytes")));
  }
  out.copy(json, out.size());
  json[out.size()] = '\0';
  return 0;
}
