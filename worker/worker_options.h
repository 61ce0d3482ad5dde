// What bnps_worker runs, from its command line: the flags of the binary
// (defined in worker_options.cc, with the job's flags of policy/job_flags.h,
// the TLS and token flags of security/security_flags.h and the metrics flags
// of metrics/metrics_flags.h) turned into the options of the client, the
// model and the trainer, checked once, before anything is loaded or
// connected.
//
// Example (worker/bnps_worker.cc):
//   absl::StatusOr<WorkerOptions> options = WorkerOptionsFromFlags();
//   absl::Status s = options.ok() ? RunWorker(*options) : options.status();
//
// Thread-safety: WorkerOptionsFromFlags reads the process's flags and
// environment; call it after the command line is parsed, while nothing sets
// flags.

#ifndef BNPS_WORKER_WORKER_OPTIONS_H_
#define BNPS_WORKER_WORKER_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/grpc_ps_client.h"
#include "nn/model.h"
#include "proto/bnps.pb.h"
#include "worker/device_choice.h"
#include "worker/trainer.h"

namespace bnps::worker {

// The flags the servers own (policy/job_flags.h) as this worker was given
// them: empty or unset when not given.
struct GivenJobFlags {
  std::string policy;
  std::string bn_policy;
  std::string gradients;
  std::optional<int64_t> staleness;
  std::optional<int> bn_group_size;
  std::string bn_group;
  std::optional<int64_t> bn_staleness;
  std::optional<double> learning_rate;
  std::optional<double> momentum;
  std::optional<double> weight_decay;
};

// OK when every flag in `given` agrees with the servers' `config`;
// FAILED_PRECONDITION naming the first that does not ("--staleness=2 but the
// servers run staleness 0 ..."); the error of policy::ResolvePolicy for
// policy flags that do not resolve. The client calls it before registering
// (GrpcClientOptions::check_config).
// OK unless the servers' exact BN staleness is as long as the run
// (--max_steps > 0 and bn_staleness >= it: no step would see the other
// workers' moments); FAILED_PRECONDITION naming both then.
absl::Status CheckRunLength(const proto::JobConfig& config, int64_t max_steps);

absl::Status CheckAgainstServers(const GivenJobFlags& given,
                                 const proto::JobConfig& config);

// The flag name of the job's policy in `config` ("async"), or "unknown".
std::string ConfigPolicyName(const proto::JobConfig& config);

// Everything bnps_worker needs from its flags.
struct WorkerOptions {
  // --servers, shard 0 first; never empty.
  std::vector<std::string> servers;
  int worker = 0;       // --worker, in [0, num_workers)
  int num_workers = 1;  // --num_workers
  int threads = 1;      // --threads: OpenMP threads per model replica
  int replicas = 1;     // --replicas, in [1, 64]
  // --progress: auto | line | plain | none.
  std::string progress = "auto";
  // --model, --depth, --width. bn_momentum is the servers': RunWorker sets it.
  nn::ModelOptions model;
  // --report: the JSON report's path (checked writable); empty: none.
  std::string report_path;
  // --metrics_linger_s, >= 0 and finite.
  double metrics_linger_s = 0;
  // --device, --gpu, --replicas, and LOCAL_RANK and CUDA_VISIBLE_DEVICES.
  DeviceRequest devices;
  // --data: "fashion-mnist" (from data_dir, --data_dir) or "synthetic".
  std::string data = "fashion-mnist";
  std::string data_dir;
  // The client's options, check_config included (CheckAgainstServers of
  // `given`); on_retry is unset: RunWorker counts the retries.
  client::GrpcClientOptions client;
  GivenJobFlags given;
  // The trainer's options; the replicas, metrics, on_progress and
  // on_replica_thread are RunWorker's to set.
  TrainerOptions trainer;
};

// The options the flags describe. INVALID_ARGUMENT naming the flag for a
// value out of range or not one of the choices (--servers empty, --worker
// outside [0, --num_workers), --eval=x, --model=x, --data=x, ...) or a
// --report that cannot be written (the file is created); the error of the
// file for unreadable TLS files or token. Starts nothing.
absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags();

}  // namespace bnps::worker

#endif  // BNPS_WORKER_WORKER_OPTIONS_H_
