// The command line of a bnps binary: absl::ParseCommandLine with the exit
// statuses and help the docs promise.
//
//   --help (also --helpfull, --helpshort, --helppackage, --help=substring)
//       prints the usage message and every flag the binary defines (those of
//       its main file and of the libraries it links, such as the TLS and token
//       flags of security/security_flags.cc; Abseil's own flags only with
//       --helpfull) on stdout and exits 0. --version exits 0 too.
//   An unknown flag, a flag without its value or with a value of the wrong
//       type, an unreadable --flagfile: Abseil's one line "ERROR: ..." on
//       stderr, and exit status 2 (the binaries' status for bad flags; Abseil
//       alone would exit 1).
//   Flags are first taken from the environment (BNPS_<FLAG>, and the
//       Kubernetes roles `env` names; util/env_flags.h), then from the command
//       line, which wins. A variable it cannot use: one line "ERROR: ..." on
//       stderr naming it, and exit status 2. --help ends with the variables.
//
// Example:
//   int main(int argc, char** argv) {
//     bnps::util::EnvFlagsOptions env;
//     env.job_index_flag = "worker";  // JOB_COMPLETION_INDEX sets --worker
//     bnps::util::ParseCommandLine(argc, argv, "What it does.\n  usage: ...",
//                                  env);
//     ...
//   }
//
// Thread-safety: call once, from main, before other threads start. Linking
// this library installs Abseil's fatal-usage-error hook for the whole binary.

#ifndef BNPS_UTIL_COMMAND_LINE_H_
#define BNPS_UTIL_COMMAND_LINE_H_

#include <vector>

#include "absl/strings/string_view.h"
#include "util/env_flags.h"

namespace bnps::util {

// The exit status of a binary given flags it cannot use.
inline constexpr int kBadFlagsExitCode = 2;

// Sets `usage` as the program usage message, sets flags from the environment
// as `env` says, parses the command line and returns the positional arguments
// (argv[0] first). Does not return after --help or a bad flag or variable
// (see above).
std::vector<char*> ParseCommandLine(int argc, char** argv,
                                    absl::string_view usage,
                                    const EnvFlagsOptions& env = {});

}  // namespace bnps::util

#endif  // BNPS_UTIL_COMMAND_LINE_H_
