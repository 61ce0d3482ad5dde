// Flags from the environment, so that one container image and one manifest
// serve every replica of a job.
//
//   BNPS_<FLAG>           sets --<flag> (BNPS_NUM_WORKERS=4 is --num_workers=4).
//                         A flag given on the command line wins.
//   JOB_COMPLETION_INDEX  sets the options' `job_index_flag` (the worker's
//                         --worker) when neither the flag nor its variable is
//                         given: Kubernetes sets it in each pod of an Indexed
//                         Job, 0 to completions-1.
//   BNPS_<FLAG>=from-hostname, for the options' `ordinal_flag` (the server's
//                         --shard): the number after the last '-' of the host
//                         name, which is a StatefulSet pod's ordinal
//                         (bnps-server-1 is shard 1). Opt-in, so that a host
//                         that happens to be called node-3 never picks a shard.
//
// A BNPS_ variable that names no flag of the binary is a warning line naming
// it (a typo must not pass unnoticed), or an error when the options say so.
// Not an error by default: one environment often serves several programs
// (a shell that starts a server and a worker, a container set up for a server
// where bnps_status runs by hand, a test's own BNPS_CHAOS_* settings).
// Only the binary's own flags count, not Abseil's (--flagfile, --help, ...).
//
// PlanFromEnvironment is the pure part (tests give it an environment and a
// host name); ApplyEnvironment sets the process's flags from its environment
// and is what util/command_line calls before it parses the command line.
//
// Thread-safety: ApplyEnvironment sets global flags: call it once, from main,
// before other threads start. The rest is pure.

#ifndef BNPS_UTIL_ENV_FLAGS_H_
#define BNPS_UTIL_ENV_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bnps::util {

// The prefix of every variable that sets a flag.
inline constexpr absl::string_view kEnvPrefix = "BNPS_";
// Set by Kubernetes in the pods of an Indexed Job.
inline constexpr absl::string_view kJobIndexVariable = "JOB_COMPLETION_INDEX";
// The value of the ordinal flag's variable that takes it from the host name.
inline constexpr absl::string_view kFromHostname = "from-hostname";

struct EnvFlagsOptions {
  // The flag JOB_COMPLETION_INDEX sets when neither it nor its variable is
  // given. Default: empty (none).
  std::string job_index_flag;
  // The flag whose variable may say kFromHostname. Default: empty (none).
  std::string ordinal_flag;
  // An unknown BNPS_ variable: an error (true) or a warning (false).
  // Default: false.
  bool unknown_is_error = false;
};

// One flag value taken from the environment.
struct EnvAssignment {
  std::string flag;    // "num_workers"
  std::string value;   // "4"
  std::string source;  // "BNPS_NUM_WORKERS=4", for messages
};

struct EnvPlan {
  std::vector<EnvAssignment> assignments;  // in a fixed order (by variable)
  std::vector<std::string> warnings;       // one line each, no newline
};

// The variable that sets `flag`: "BNPS_" and the flag's name in upper case.
std::string VariableFor(absl::string_view flag);

// Which flags `env` (NAME=VALUE entries, as in environ) sets, given the
// binary's flag names and its host name. Errors (InvalidArgument, the
// message names the variable): an unknown BNPS_ variable when
// `unknown_is_error`; kFromHostname when `hostname` has no -N suffix;
// JOB_COMPLETION_INDEX that is not a non-negative integer (only when it is
// used). Entries without '=' are ignored.
absl::StatusOr<EnvPlan> PlanFromEnvironment(
    const std::vector<std::string>& env, const std::vector<std::string>& flags,
    absl::string_view hostname, const EnvFlagsOptions& options);

// The flag names that the environment may set in this binary: every flag not
// defined by Abseil itself, sorted.
std::vector<std::string> BinaryFlagNames();

// Sets the binary's flags from the process environment (environ and
// gethostname). Call before parsing the command line, so that flags given
// there win. Prints the plan's warnings on stderr. Errors: those of
// PlanFromEnvironment, and a value the flag cannot take (InvalidArgument
// naming the variable).
absl::Status ApplyEnvironment(const EnvFlagsOptions& options);

// The --help section that says which variable sets each flag.
std::string EnvironmentHelp(const std::vector<std::string>& flags,
                            const EnvFlagsOptions& options);

}  // namespace bnps::util

#endif  // BNPS_UTIL_ENV_FLAGS_H_
