// What bnps_status does, from its command line: the flags of the binary
// (defined in status_options.cc, with --job of policy/job_flags.h and the
// TLS and token flags of security/security_flags.h), checked once.
//
// Example (tools/bnps_status.cc):
//   absl::StatusOr<StatusOptions> options = StatusOptionsFromFlags();
//   if (!options.ok()) ...          // one line naming the flag; exit 2
//   return RunStatus(*options);     // tools/status_main.h
//
// Thread-safety: StatusOptionsFromFlags reads the process's flags; call it
// after the command line is parsed.

#ifndef BNPS_TOOLS_STATUS_OPTIONS_H_
#define BNPS_TOOLS_STATUS_OPTIONS_H_

#include <string>

#include "absl/status/statusor.h"
#include "client/job_reader.h"

namespace bnps::tools {

// Everything bnps_status needs from its flags.
struct StatusOptions {
  // --servers (never empty), --job, --timeout_ms and the credentials.
  client::JobReaderOptions reader;
  // What to print. export_path wins over digest, digest over the views.
  std::string export_path;  // --export: write a safetensors file here
  bool digest = false;      // --digest: the one line of the state's hash
  bool json = false;        // --json: one JSON document (not with watch)
  bool watch = false;       // --watch: refresh a text view in place
  // --interval_s (> 0) and --count (>= 0; 0: until stopped) of watch.
  double interval_s = 2;
  int count = 0;
};

// The options the flags describe. INVALID_ARGUMENT naming the flag for an
// empty --servers, a --interval_s <= 0 or --count < 0, or --watch with
// --json; the error of the file for unreadable TLS files or token.
absl::StatusOr<StatusOptions> StatusOptionsFromFlags();

}  // namespace bnps::tools

#endif  // BNPS_TOOLS_STATUS_OPTIONS_H_
