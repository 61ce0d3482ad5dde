// The body of bnps_server: readies the process, starts a RunningServer
// (server/server_runner.h) with ServerOptions (server/server_options.h),
// prints where it listens, and serves until the job is complete or a signal
// stops it.
//
// Example (server/bnps_server.cc):
//   if (absl::Status s = PrepareServerProcess(); !s.ok()) ...  // exit 2
//   absl::StatusOr<ServerOptions> options = ServerOptionsFromFlags();
//   ...
//   return RunServer(*options);
//
// Thread-safety: both from main, PrepareServerProcess before any other
// thread starts.

#ifndef BNPS_SERVER_SERVER_MAIN_H_
#define BNPS_SERVER_SERVER_MAIN_H_

#include "absl/status/status.h"
#include "server/server_options.h"

namespace bnps::server {

// Before any thread starts: turns off Abseil's Mutex deadlock detection
// (Debian builds it on; tests keep it, binaries do not), applies
// --heap_keep_mb (util/heap_flags.h; its error is returned), raises the
// soft descriptor limit to the hard one (a failure is only said on stderr),
// and blocks SIGINT, SIGTERM and SIGUSR1 in the calling thread, so every
// thread started later leaves them to RunServer.
absl::Status PrepareServerProcess();

// Runs the server of `options` until the job is complete (unless
// keep_serving) or SIGINT/SIGTERM (SIGTERM with a checkpoint_dir writes a
// checkpoint first), then shuts it down. Errors are one line on stderr.
// Returns the process's exit status: 0 after the job completed or a clean
// shutdown; 2 for options RunningServer::Start finds do not fit together;
// 1 for an address it cannot bind, a metrics endpoint that cannot start,
// or a final checkpoint that could not be written.
// REQUIRES: PrepareServerProcess() succeeded on this thread.
int RunServer(const ServerOptions& options);

}  // namespace bnps::server

#endif  // BNPS_SERVER_SERVER_MAIN_H_
