// The body of bnps_status: reads the job's shard servers through
// client::JobReader (never joining the job) and prints what StatusOptions
// (tools/status_options.h) ask for.
//
// Thread-safety: from main only.

#ifndef BNPS_TOOLS_STATUS_MAIN_H_
#define BNPS_TOOLS_STATUS_MAIN_H_

#include "tools/status_options.h"

namespace bnps::tools {

// Prints the export's, digest's, JSON or text view's output on stdout and
// errors as one line on stderr. Returns the process's exit status: 0 when
// every server answered (watch: the last time); 1 when one did not; 2 when
// the reader cannot be made from the options.
int RunStatus(const StatusOptions& options);

}  // namespace bnps::tools

#endif  // BNPS_TOOLS_STATUS_MAIN_H_
