#include "util/command_line.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

// Abseil calls this after printing a fatal usage error ("ERROR: Unknown
// command line flag 'x'") and would then exit 1; the binaries promise 2.
// The line Abseil printed is the whole message, so nothing is added.
extern "C" void ABSL_INTERNAL_C_SYMBOL(AbslInternalReportFatalUsageError)(
    absl::string_view) {
  std::exit(bnps::util::kBadFlagsExitCode);
}

namespace bnps::util {
namespace {

// Abseil's own flags (--flagfile, --fromenv, ...) are left to --helpfull.
bool IsAbseilFile(absl::string_view filename) {
  return absl::StartsWith(filename, "absl/") ||
         absl::StrContains(filename, "/absl/");
}

bool IsBinaryFlagFile(absl::string_view filename) {
  return !IsAbseilFile(filename);
}

}  // namespace

std::vector<char*> ParseCommandLine(int argc, char** argv,
                                    absl::string_view usage,
                                    const EnvFlagsOptions& env) {
  absl::SetProgramUsageMessage(usage);
  // Abseil's default shows only the flags of the file named after the
  // binary, which hides the flags of linked libraries (security_flags.cc).
  absl::FlagsUsageConfig config;
  config.contains_help_flags = &IsBinaryFlagFile;
  config.contains_helpshort_flags = &IsBinaryFlagFile;
  config.contains_helppackage_flags = &IsBinaryFlagFile;
  absl::SetFlagsUsageConfig(config);
  // The environment first, so that the command line parsed next wins.
  if (absl::Status s = ApplyEnvironment(env); !s.ok()) {
    std::fprintf(stderr, "ERROR: %s\n", std::string(s.message()).c_str());
    std::exit(kBadFlagsExitCode);
  }
  // What absl::ParseCommandLine does, except that the help flags are handled
  // here, so that help exits 0 (Abseil 20220623, Debian's, has no public way
  // to do this; newer Abseil has absl::ParseAbseilFlagsOnly).
  std::vector<char*> positional = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  if (absl::flags_internal::HandleUsageFlags(
          std::cout, absl::ProgramUsageMessage()) != -1) {
    const absl::flags_internal::HelpMode mode =
        absl::flags_internal::GetFlagsHelpMode();
    if (mode != absl::flags_internal::HelpMode::kVersion &&
        mode != absl::flags_internal::HelpMode::kOnlyCheckArgs) {
      std::cout << EnvironmentHelp(BinaryFlagNames(), env);
    }
    std::cout << std::flush;
    std::exit(0);
  }
  return positional;
}

}  // namespace bnps::util
