// bnps_worker: one worker of a bnps job. Trains the model on its shard of
// Fashion-MNIST against the job's shard servers and prints the test accuracy.
//
//   bnps_worker --servers=127.0.0.1:7000,127.0.0.1:7001 --worker=0
//       --num_workers=4 --epochs=1   (one command line)
//
// Exit status: 0 on success, 2 for bad flags, 1 when training fails; errors
// are one line on stderr.

#include <cstdio>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "util/command_line.h"
#include "util/log_escape.h"
#include "worker/worker_main.h"
#include "worker/worker_options.h"

int main(int argc, char** argv) {
  // --help exits 0; an unknown or malformed flag exits 2. Flags may come
  // from BNPS_* variables, the worker's id from an Indexed Job's
  // JOB_COMPLETION_INDEX.
  bnps::util::EnvFlagsOptions env;
  env.job_index_flag = "worker";
  bnps::util::ParseCommandLine(
      argc, argv,
      "A worker of a bnps job: trains the model on its shard of the data "
      "against the job's shard servers.\n"
      "  bnps_worker --servers=127.0.0.1:7000,127.0.0.1:7001 --worker=0 "
      "--num_workers=4 --epochs=1\n"
      "Exit status: 0 on success or --help; 2 for bad flags; 1 when training "
      "fails (servers unreachable, missing data, ...).",
      env);
  absl::Status s = bnps::worker::PrepareWorkerProcess();
  if (s.ok()) {
    absl::StatusOr<bnps::worker::WorkerOptions> options =
        bnps::worker::WorkerOptionsFromFlags();
    s = options.ok() ? bnps::worker::RunWorker(*options) : options.status();
  }
  if (!s.ok()) {
    // The message may quote a server's (a peer's) words.
    std::fprintf(stderr, "bnps_worker: %s\n",
                 bnps::util::EscapeForLog(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
