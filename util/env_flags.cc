#include "util/env_flags.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/internal/commandlineflag.h"
#include "absl/flags/internal/private_handle_accessor.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace bnps::util {
namespace {

// Abseil's own flags (--flagfile, --fromenv, --help, ...) are not the
// binary's, and a variable does not set them.
bool IsAbseilFile(absl::string_view filename) {
  return absl::StartsWith(filename, "absl/") ||
         absl::StrContains(filename, "/absl/");
}

// The ordinal of a StatefulSet pod from its host name: "bnps-server-12" is 12.
bool OrdinalOf(absl::string_view hostname, std::string* ordinal) {
  const size_t dash = hostname.rfind('-');
  if (dash == absl::string_view::npos || dash + 1 == hostname.size()) {
    return false;
  }
  const absl::string_view digits = hostname.substr(dash + 1);
  if (!std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return false;
  }
  int value = 0;
  if (!absl::SimpleAtoi(digits, &value)) return false;
  *ordinal = absl::StrCat(value);
  return true;
}

bool IsIndex(absl::string_view s) {
  int value = 0;
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), absl::ascii_isdigit) &&
         absl::SimpleAtoi(s, &value);
}

}  // namespace

std::string VariableFor(absl::string_view flag) {
  return absl::StrCat(kEnvPrefix, absl::AsciiStrToUpper(flag));
}

absl::StatusOr<EnvPlan> PlanFromEnvironment(
    const std::vector<std::string>& env, const std::vector<std::string>& flags,
    absl::string_view hostname, const EnvFlagsOptions& options) {
  std::map<std::string, std::string> by_variable;  // variable -> flag
  for (const std::string& flag : flags) by_variable[VariableFor(flag)] = flag;
  // Sorted by variable, so the plan does not depend on environ's order; the
  // last entry of a duplicated variable wins, as getenv's first would not,
  // but a process environment has no duplicates.
  std::map<std::string, std::string> values;
  std::string job_index;
  bool has_job_index = false;
  for (const std::string& entry : env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    std::string name = entry.substr(0, eq);
    std::string value = entry.substr(eq + 1);
    if (name == kJobIndexVariable) {
      has_job_index = true;
      job_index = value;
    } else if (absl::StartsWith(name, kEnvPrefix)) {
      values[name] = value;
    }
  }

  EnvPlan plan;
  bool job_index_flag_set = false;
  for (const auto& [name, value] : values) {
    auto it = by_variable.find(name);
    if (it == by_variable.end()) {
      std::string message = absl::StrCat(
          name, " is set but sets no flag of this program (variables are "
                "BNPS_ and a flag's name in upper case; see --help)");
      if (options.unknown_is_error) {
        return absl::InvalidArgumentError(message);
      }
      plan.warnings.push_back(absl::StrCat("warning: ", message, "; ignored"));
      continue;
    }
    const std::string& flag = it->second;
    std::string flag_value = value;
    if (flag == options.ordinal_flag && value == kFromHostname) {
      if (!OrdinalOf(hostname, &flag_value)) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, "=", kFromHostname, " but the host name '", hostname,
            "' does not end in -N (a StatefulSet pod's ordinal, as in "
            "bnps-server-1)"));
      }
    }
    if (flag == options.job_index_flag) job_index_flag_set = true;
    plan.assignments.push_back(
        {flag, flag_value, absl::StrCat(name, "=", value)});
  }
  if (!options.job_index_flag.empty() && !job_index_flag_set &&
      has_job_index) {
    if (!IsIndex(job_index)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kJobIndexVariable, "='", job_index,
                       "' is not an index (0, 1, ...)"));
    }
    // First, so that the plan reads in the order it is applied.
    plan.assignments.insert(
        plan.assignments.begin(),
        {options.job_index_flag, job_index,
         absl::StrCat(kJobIndexVariable, "=", job_index)});
  }
  return plan;
}

std::vector<std::string> BinaryFlagNames() {
  std::vector<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired() || IsAbseilFile(flag->Filename())) continue;
    names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status ApplyEnvironment(const EnvFlagsOptions& options) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    env.emplace_back(*e);
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  absl::StatusOr<EnvPlan> plan =
      PlanFromEnvironment(env, BinaryFlagNames(), host, options);
  if (!plan.ok()) return plan.status();
  for (const std::string& warning : plan->warnings) {
    std::fprintf(stderr, "%s\n", warning.c_str());
  }
  for (const EnvAssignment& a : plan->assignments) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(a.flag);
    if (flag == nullptr) {
      return absl::InternalError(absl::StrCat("no flag --", a.flag));
    }
    std::string error;
    if (!absl::flags_internal::PrivateHandleAccessor::ParseFrom(
            *flag, a.value, absl::flags_internal::SET_FLAGS_VALUE,
            absl::flags_internal::kProgrammaticChange, error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(a.source, ": not a value for --", a.flag,
                       error.empty() ? "" : absl::StrCat(" (", error, ")")));
    }
  }
  return absl::OkStatus();
}

std::string EnvironmentHelp(const std::vector<std::string>& flags,
                            const EnvFlagsOptions& options) {
  std::string out = absl::StrCat(
      "\n  Environment: every flag can also be set by a variable; a flag on\n"
      "  the command line wins, and an unknown BNPS_ variable is ",
      options.unknown_is_error ? "an error" : "a warning", ".\n");
  for (const std::string& flag : flags) {
    std::string line = absl::StrCat("    ", VariableFor(flag));
    line.resize(std::max<size_t>(line.size() + 1, 34), ' ');
    absl::StrAppend(&out, line, "sets --", flag);
    if (flag == options.job_index_flag) {
      absl::StrAppend(&out, "; without it and --", flag, ", ",
                      kJobIndexVariable,
                      " does (a Kubernetes Indexed Job's pod index)");
    }
    if (flag == options.ordinal_flag) {
      absl::StrAppend(&out, "; ", VariableFor(flag), "=", kFromHostname,
                      " takes the N of a host name ending in -N (a "
                      "StatefulSet pod's ordinal)");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace bnps::util
