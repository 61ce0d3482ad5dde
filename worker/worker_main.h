// The body of bnps_worker: with WorkerOptions (worker/worker_options.h),
// chooses the devices, loads the data, connects to the job's servers,
// trains, prints the result and leaves the job.
//
// Example (worker/bnps_worker.cc):
//   absl::Status s = PrepareWorkerProcess();
//   absl::StatusOr<WorkerOptions> options = ...WorkerOptionsFromFlags();
//   if (s.ok()) s = options.ok() ? RunWorker(*options) : options.status();
//
// Thread-safety: from main only.

#ifndef BNPS_WORKER_WORKER_MAIN_H_
#define BNPS_WORKER_WORKER_MAIN_H_

#include "absl/status/status.h"
#include "worker/worker_options.h"

namespace bnps::worker {

// Before any thread starts: turns off Abseil's Mutex deadlock detection
// (Debian builds it on; tests keep it, binaries do not) and applies
// --heap_keep_mb (util/heap_flags.h), whose error it returns.
absl::Status PrepareWorkerProcess();

// Trains as `options` say, printing its progress and result on stdout.
// OK after training (or when the servers say this worker already finished
// the job); INVALID_ARGUMENT for options that do not fit (e.g. --device=gpu
// without a GPU); else the error that stopped it (servers unreachable,
// missing data, a failed step, ...), naming the flag to check where one
// applies.
absl::Status RunWorker(const WorkerOptions& options);

}  // namespace bnps::worker

#endif  // BNPS_WORKER_WORKER_MAIN_H_
