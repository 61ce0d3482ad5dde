// Flags set by name in a test, as a command line would set them, and put
// back when the test ends. For the tests of a binary's flag conversion
// (server/server_options_test.cc, ...): those read the process's flags.
//
// Example:
//   util::ScopedFlags flags;
//   ASSERT_TRUE(flags.Set("port", "7001").ok());
//   absl::StatusOr<ServerOptions> o = ServerOptionsFromFlags();
//
// Thread-safety: as absl::FlagSaver; from the test's thread only.

#ifndef BNPS_UTIL_FLAGS_TESTING_H_
#define BNPS_UTIL_FLAGS_TESTING_H_

#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace bnps::util {

class ScopedFlags {
 public:
  // Sets --name=value. NOT_FOUND for a flag the binary does not define;
  // INVALID_ARGUMENT, with Abseil's words, for a value of the wrong type.
  absl::Status Set(absl::string_view name, absl::string_view value) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      return absl::NotFoundError(absl::StrCat("no flag --", name));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "=", value, ": ", error));
    }
    return absl::OkStatus();
  }

 private:
  absl::FlagSaver saver_;  // restores every flag when the test ends
};

}  // namespace bnps::util

#endif  // BNPS_UTIL_FLAGS_TESTING_H_
