// bnps_worker: one worker of a bnps job. Trains the model on its shard of
// Fashion-MNIST against the job's shard servers and prints the test accuracy.
//
//   bnps_worker --servers=127.0.0.1:7000,127.0.0.1:7001 --worker=0
//       --num_workers=4 --epochs=1   (one command line)
//
// Exit status: 0 on success, 2 for bad flags, 1 when training fails; errors
// are one line on stderr.

#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bn/cuda_kernels.h"
#include "worker/data/dataset.h"
#include "worker/data/idx.h"
#include "worker/data/synthetic.h"
#include "nn/backend.h"
#include "nn/cpu_backend.h"
#include "nn/cuda_backend.h"
#include "nn/model.h"
#include "client/grpc_ps_client.h"
#include "policy/job_flags.h"
#include "policy/policy.h"
#include "proto/generation.h"
#include "security/security_flags.h"
#include "util/command_line.h"
#include "util/heap_flags.h"
#include "util/log_escape.h"
#include "metrics/http_endpoint.h"
#include "metrics/metrics_flags.h"
#include "metrics/registry.h"
#include "worker/console_output.h"
#include "worker/device_choice.h"
#include "worker/dropped_watch.h"
#include "worker/worker_metrics.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, servers, "",
          "The job's shard servers as host:port, comma-separated, in shard "
          "order (required).");
ABSL_FLAG(int, worker, 0, "This worker's id, in [0, num_workers).");
ABSL_FLAG(int64_t, batch_size, 32, "Examples per step on this worker.");
ABSL_FLAG(int64_t, epochs, 1, "Passes over the training data.");
ABSL_FLAG(int64_t, max_steps, 0,
          "Stop after this many steps (0: run all epochs); the same on every "
          "worker.");
ABSL_FLAG(int64_t, leave_at_step, 0,
          "sync: this worker, the job's highest, leaves the job once it reached "
          "this step; the job goes on without it from the newest checkpoint "
          "every server has (docs/reliability.md). 0: never.");
ABSL_FLAG(int64_t, timing_warmup_steps, 0,
          "Leave steps numbered below this out of the report's time split "
          "(seconds: total, compute, bn_sync, grad_sync) and images/s; they "
          "still train. For benchmarks (bench/step_overhead.py).");
ABSL_FLAG(uint64_t, seed, 1,
          "Seed of the initial parameters and the shuffle; the same on every "
          "worker.");
ABSL_FLAG(std::string, device, "auto",
          "auto (a GPU when there is one, else the CPU) | cpu | gpu.");
ABSL_FLAG(int, gpu, -1,
          "Which CUDA device (after CUDA_VISIBLE_DEVICES), for --device=gpu or "
          "auto; -1: LOCAL_RANK modulo the visible devices when LOCAL_RANK is "
          "set (torchrun, tools/bnps_launch.py), else device 0.");
ABSL_FLAG(int, threads, 1,
          "CPU threads for the model (oneDNN and the loops; OpenMP). Several "
          "workers on one machine should share its cores.");
ABSL_FLAG(int, replicas, 1,
          "Model replicas this worker drives (co-located aggregation): each "
          "step's batch (--batch_size) is split among them, they combine "
          "their BN statistics and gradients in this process and cross to "
          "the servers once, as one worker. On GPUs one replica per device "
          "(--gpu, --gpu + 1, ...), sharing devices (each replica on its own "
          "stream) when there are fewer GPUs than replicas; on the CPU one "
          "thread each, with --threads threads.");
ABSL_FLAG(std::string, data, "fashion-mnist",
          "fashion-mnist (IDX files in --data_dir) | synthetic (generated, "
          "for tests).");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Directory of the Fashion-MNIST IDX files (gzip or plain), as "
          "Debian's dataset-fashion-mnist installs them.");
ABSL_FLAG(int64_t, train_examples, 0,
          "Train on the first this-many examples only (0: all 60000).");
ABSL_FLAG(int64_t, test_examples, 0,
          "Evaluate on the first this-many test examples (0: all 10000).");
ABSL_FLAG(std::string, model, "cnn",
          "The model (nn/model.h, docs/worker.md): cnn (ResNet-style, "
          "BN on 28x28 to 7x7 maps: 49 positions per example at least) | deep "
          "(the cnn continued to 4x4 and 2x2 maps: 4 positions) | fc_bn (BN "
          "after fully connected layers: statistics over the batch alone).");
ABSL_FLAG(int64_t, depth, 1,
          "Residual blocks per stage of the model (fc_bn: hidden layers - 1).");
ABSL_FLAG(int64_t, width, 16,
          "Channels of the model's first stage (the second has twice as "
          "many, deep's third and fourth four times; fc_bn's hidden layers "
          "have 8 x width units).");
ABSL_FLAG(std::string, recal_mode, "precise",
          "How recal recomputes BN statistics: precise (one pass, all layers) "
          "| exact (layer by layer, as inference sees them).");
ABSL_FLAG(bool, recalibrate, false,
          "Under sync, async or local: also recalibrate after training and "
          "report a second test accuracy. Every worker must agree.");
ABSL_FLAG(int64_t, recal_examples, 0,
          "Recalibrate over the first this-many training examples (0: those "
          "trained on).");
ABSL_FLAG(std::string, eval, "first",
          "Which workers evaluate on the test set at the end: first (worker 0) "
          "| all | none.");
ABSL_FLAG(bool, eval_every_epoch, false,
          "Also evaluate after every epoch (for accuracy-over-time curves).");
ABSL_FLAG(std::string, progress, "auto",
          "auto (a refreshed line on a terminal, else plain lines) | line | "
          "plain | none.");
ABSL_FLAG(double, progress_interval_s, 2, "Seconds between progress reports.");
ABSL_FLAG(double, metrics_linger_s, 0,
          "With --metrics_port: keep serving metrics this many seconds after "
          "training ends, so that a scraper sees the final figures.");
ABSL_FLAG(std::string, report, "",
          "Write a JSON report of the run here (loss curve, accuracy, time "
          "split into compute, BN sync and gradient sync).");
ABSL_FLAG(bool, overlap, true,
          "Push each layer's gradients as soon as the backward pass has them, "
          "overlapping the push with the rest of the pass; false pushes them "
          "all after it (the results are the same bit for bit).");
ABSL_FLAG(bool, layer_pull, false,
          "sync, recal and local: pull each step's parameters layer by layer, "
          "the forward pass waiting for a layer's just before it runs, so it "
          "starts on the first layer while the rest are still on their way; "
          "false pulls all of them before the pass (the results are the same "
          "bit for bit). async always pulls them all.");
ABSL_FLAG(bool, overlap_bn, false,
          "Compute a convolution's weight gradient while the BN before it "
          "exchanges its backward sums (on a thread of its own); the results "
          "are the same bit for bit.");
ABSL_FLAG(int64_t, push_part_bytes, int64_t{1} << 20,
          "With --overlap: send the layers' gradients once those not yet "
          "sent hold this many bytes (each send is a call per server); 0 "
          "sends every layer's as it comes.");
ABSL_FLAG(double, connect_timeout_s, 30,
          "How long to try to reach every server at start, in seconds: while "
          "one does not answer (not up yet, a closed port, a wrong host) the "
          "worker retries with backoff, then stops with an error naming its "
          "address.");
ABSL_FLAG(double, rpc_timeout_s, 60,
          "Deadline of every call to the servers once connected, in seconds.");
ABSL_FLAG(bool, bn_over_tcp, true,
          "Send BN traffic over raw TCP to the servers that offer it "
          "(bnps_server --bn_port), with the gRPC stream as the fallback; "
          "never with TLS. false: always the gRPC stream.");
ABSL_FLAG(bool, bn_unix, true,
          "With --bn_over_tcp: try a server's Unix socket first (bnps_server "
          "--bn_unix_socket; same host only, cheaper than loopback TCP), "
          "then TCP on any failure. false: TCP only.");
ABSL_FLAG(std::string, bn_host_aggregator, "",
          "HOST:PORT of this host's BN aggregator (bnps_host_bn): the BN "
          "traffic of the host's workers crosses to each shard as one frame "
          "per layer, phase and step, with the same results. Empty: each "
          "shard directly.");
ABSL_FLAG(int, bn_spin_us, -1,
          "How long a BN exchange polls for its answer before it sleeps, in "
          "microseconds: saves the wake-up (tens of microseconds an exchange) "
          "but keeps a core busy meanwhile. -1: 1000 when this machine has a "
          "core for every model thread of every worker and every server of "
          "the job (num_workers * threads * replicas + servers), as if all ran "
          "here; else 0.");

namespace bnps::worker {
namespace {

absl::Status Check(bool ok, const std::string& message) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(message);
}

// The flag name of the job's policy as the servers reported it.
std::string PolicyName(const proto::JobConfig& c) {
  absl::StatusOr<policy::JobPolicy> p = policy::FromConfig(c);
  return p.ok() ? policy::JobPolicyName(*p) : "unknown";
}

// Flags the servers own must agree with theirs when given. Connect calls it
// before registering (GrpcClientOptions::check_config).
absl::Status CheckAgainstServers(const proto::JobConfig& c) {
  const std::string policy = absl::GetFlag(FLAGS_policy);
  const std::string bn_policy = absl::GetFlag(FLAGS_bn_policy);
  const std::string gradients = absl::GetFlag(FLAGS_gradients);
  absl::StatusOr<policy::JobPolicy> mine =
      policy::ResolvePolicy(policy, bn_policy, gradients);
  if (!mine.ok()) return mine.status();
  absl::StatusOr<policy::JobPolicy> servers = policy::FromConfig(c);
  const std::string theirs = PolicyName(c);
  auto mismatch = [](const std::string& flag, const std::string& mine,
                     const std::string& servers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--", flag, "=", mine, " but the servers run ", flag, " ", servers,
        " (start them with the same value, or leave the flag out)"));
  };
  if (!servers.ok()) return servers.status();
  if (!policy.empty() && !(*mine == *servers)) {
    return mismatch("policy", policy, theirs);
  }
  if (!bn_policy.empty() && mine->bn != servers->bn) {
    return mismatch("bn_policy", bn_policy, policy::PolicyName(servers->bn));
  }
  if (!gradients.empty() && mine->gradients != servers->gradients) {
    return mismatch("gradients", gradients,
                    policy::GradientsName(servers->gradients));
  }
  const std::optional<int64_t> staleness = absl::GetFlag(FLAGS_staleness);
  if (staleness.has_value() && *staleness != c.staleness()) {
    return mismatch("staleness", absl::StrCat(*staleness),
                    absl::StrCat(c.staleness()));
  }
  const std::optional<int> groups = absl::GetFlag(FLAGS_bn_group_size);
  if (groups.value_or(c.bn_group_size()) != c.bn_group_size()) {
    return mismatch("bn_group_size", absl::StrCat(*groups),
                    absl::StrCat(c.bn_group_size()));
  }
  const struct {
    const char* name;
    std::optional<double> mine;
    double servers;
  } numbers[] = {
      {"learning_rate", absl::GetFlag(FLAGS_learning_rate), c.learning_rate()},
      {"momentum", absl::GetFlag(FLAGS_momentum), c.momentum()},
      {"weight_decay", absl::GetFlag(FLAGS_weight_decay), c.weight_decay()},
  };
  for (const auto& n : numbers) {
    if (n.mine.has_value() &&
        std::abs(*n.mine - n.servers) > 1e-12 * std::abs(n.servers)) {
      return mismatch(n.name, absl::StrCat(*n.mine), absl::StrCat(n.servers));
    }
  }
  return absl::OkStatus();
}

// Where the replicas train (worker/device_choice.h), from the flags, the
// environment and CUDA's device count.
absl::StatusOr<DeviceChoice> ChooseWorkerDevices() {
  DeviceRequest request;
  request.device = absl::GetFlag(FLAGS_device);
  request.gpu = absl::GetFlag(FLAGS_gpu);
  request.replicas = absl::GetFlag(FLAGS_replicas);
  if (const char* v = std::getenv("LOCAL_RANK"); v != nullptr) {
    request.local_rank = v;
  }
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr) {
    request.cuda_visible_devices = v;
  }
  std::string why;
  // No CUDA call at all for --device=cpu.
  const int count =
      request.device == "cpu" ? 0 : bn::CudaDeviceCount(&why);
  return ChooseDevices(request, count, why);
}

// The backend of replica `replica` on the device chosen for it.
absl::StatusOr<std::unique_ptr<nn::Backend>> MakeBackend(
    const DeviceChoice& choice, int replica) {
  if (choice.cpu()) return nn::NewCpuBackend();
  return nn::NewCudaBackend(choice.gpus[replica]);
}

struct Data {
  Dataset train;
  Dataset test;
};

absl::StatusOr<Data> LoadData() {
  const std::string kind = absl::GetFlag(FLAGS_data);
  Data d;
  if (kind == "synthetic") {
    d.train = MakeSyntheticDataset(4096, 28, 28, 10, 1);
    d.test = MakeSyntheticDataset(1024, 28, 28, 10, 2);
    return d;
  }
  if (kind != "fashion-mnist") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data=", kind, " is not one of fashion-mnist, synthetic"));
  }
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  for (Split split : {Split::kTrain, Split::kTest}) {
    absl::StatusOr<Dataset> loaded = LoadFashionMnist(dir, split);
    if (!loaded.ok()) {
      return absl::Status(
          loaded.status().code(),
          absl::StrCat(loaded.status().message(),
                       "; or point --data_dir at the IDX files"));
    }
    (split == Split::kTrain ? d.train : d.test) = *std::move(loaded);
  }
  return d;
}

// The flags' own checks (INVALID_ARGUMENT naming the flag), before anything
// is loaded or connected.
absl::Status CheckFlags(const std::vector<std::string>& servers) {
  const int worker = absl::GetFlag(FLAGS_worker);
  const int num_workers = absl::GetFlag(FLAGS_num_workers);
  const int threads = absl::GetFlag(FLAGS_threads);
  const std::string eval = absl::GetFlag(FLAGS_eval);
  const std::string progress = absl::GetFlag(FLAGS_progress);
  const double connect_timeout = absl::GetFlag(FLAGS_connect_timeout_s);
  const double rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout_s);
  const double progress_interval = absl::GetFlag(FLAGS_progress_interval_s);
  if (absl::Status s = Check(!servers.empty(),
                             "--servers is required (host:port,host:port,...)");
      !s.ok()) {
    return s;
  }
  for (const auto& [ok, message] : std::vector<std::pair<bool, std::string>>{
           {num_workers >= 1, "--num_workers must be at least 1"},
           {worker >= 0 && worker < num_workers,
            absl::StrCat("--worker=", worker, " is outside [0, --num_workers=",
                         num_workers, ")")},
           {threads >= 1, "--threads must be at least 1"},
           {absl::GetFlag(FLAGS_replicas) >= 1 &&
                absl::GetFlag(FLAGS_replicas) <= 64,
            "--replicas must be in [1, 64]"},
           {client::GrpcClientOptions::BnSpinFromUs(
                absl::GetFlag(FLAGS_bn_spin_us), 0).ok(),
            "--bn_spin_us must be in [-1, 1000000]"},
           {absl::GetFlag(FLAGS_batch_size) >= 1, "--batch_size must be >= 1"},
           {absl::GetFlag(FLAGS_epochs) >= 1, "--epochs must be >= 1"},
           {absl::GetFlag(FLAGS_max_steps) >= 0, "--max_steps must be >= 0"},
           {absl::GetFlag(FLAGS_leave_at_step) >= 0,
            "--leave_at_step must be >= 0"},
           {absl::GetFlag(FLAGS_timing_warmup_steps) >= 0,
            "--timing_warmup_steps must be >= 0"},
           {absl::GetFlag(FLAGS_train_examples) >= 0,
            "--train_examples must be >= 0"},
           {absl::GetFlag(FLAGS_test_examples) >= 0,
            "--test_examples must be >= 0"},
           {absl::GetFlag(FLAGS_recal_examples) >= 0,
            "--recal_examples must be >= 0"},
           {eval == "first" || eval == "all" || eval == "none",
            absl::StrCat("--eval=", eval, " is not one of first, all, none")},
           {progress == "auto" || progress == "line" || progress == "plain" ||
                progress == "none",
            absl::StrCat("--progress=", progress,
                         " is not one of auto, line, plain, none")},
           {connect_timeout > 0 && std::isfinite(connect_timeout),
            "--connect_timeout_s must be positive and finite"},
           {rpc_timeout > 0, "--rpc_timeout_s must be positive"},
           {progress_interval > 0, "--progress_interval_s must be positive"},
       }) {
    if (absl::Status s = Check(ok, message); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The client's options from the flags; `security` from SecurityFromFlags,
// `metrics` counts the retries.
client::GrpcClientOptions ClientOptionsFromFlags(
    const std::vector<std::string>& servers,
    const security::ClientSecurity& security, WorkerMetrics* worker_metrics) {
  const int worker = absl::GetFlag(FLAGS_worker);
  const int num_workers = absl::GetFlag(FLAGS_num_workers);
  const int threads = absl::GetFlag(FLAGS_threads);
  const int replicas = absl::GetFlag(FLAGS_replicas);
  client::GrpcClientOptions client_options;
  client_options.servers = servers;
  client_options.credentials = security.credentials;
  client_options.token = security.token;
  client_options.job = absl::GetFlag(FLAGS_job);
  client_options.worker = worker;
  client_options.num_workers = num_workers;
  client_options.connect_timeout = absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  client_options.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));
  client_options.push_part_bytes = absl::GetFlag(FLAGS_push_part_bytes);
  // Checked with the other flags.
  client_options.bn_spin = *client::GrpcClientOptions::BnSpinFromUs(
      absl::GetFlag(FLAGS_bn_spin_us),
      static_cast<int64_t>(num_workers) * threads * replicas +
          static_cast<int64_t>(servers.size()));
  client_options.bn_over_tcp = absl::GetFlag(FLAGS_bn_over_tcp);
  client_options.bn_unix = absl::GetFlag(FLAGS_bn_unix);
  client_options.bn_host_aggregator = absl::GetFlag(FLAGS_bn_host_aggregator);
  // Checked before the worker joins: a launch with flags that do not fit the
  // job stops here and leaves the servers as they were.
  client_options.check_config = CheckAgainstServers;
  client_options.on_retry = [worker_metrics](absl::StatusCode code) {
    worker_metrics->Retry(code);
  };
  return client_options;
}

// The trainer's options from the flags (the replicas, progress and metrics
// are the caller's to add).
TrainerOptions TrainerOptionsFromFlags(RecalMode recal_mode) {
  const int threads = absl::GetFlag(FLAGS_threads);
  const std::string eval = absl::GetFlag(FLAGS_eval);
  TrainerOptions options;
  // OpenMP's thread count is per thread: each replica's thread sets its own.
  options.on_replica_thread = [threads](int) { omp_set_num_threads(threads); };
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.epochs = absl::GetFlag(FLAGS_epochs);
  options.max_steps = absl::GetFlag(FLAGS_max_steps);
  options.leave_at_step = absl::GetFlag(FLAGS_leave_at_step);
  options.timing_warmup_steps = absl::GetFlag(FLAGS_timing_warmup_steps);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.overlap = absl::GetFlag(FLAGS_overlap);
  options.overlap_bn = absl::GetFlag(FLAGS_overlap_bn);
  options.layer_pull = absl::GetFlag(FLAGS_layer_pull);
  options.train_examples = absl::GetFlag(FLAGS_train_examples);
  options.test_examples = absl::GetFlag(FLAGS_test_examples);
  options.recal_mode = recal_mode;
  options.recalibrate = absl::GetFlag(FLAGS_recalibrate);
  options.recal_examples = absl::GetFlag(FLAGS_recal_examples);
  options.evaluate = eval == "all" || (eval == "first" && absl::GetFlag(FLAGS_worker) == 0);
  options.eval_every_epoch = absl::GetFlag(FLAGS_eval_every_epoch);
  options.progress_interval = absl::Seconds(absl::GetFlag(FLAGS_progress_interval_s));
  return options;
}

absl::Status Main() {
  const std::vector<std::string> servers =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  const int worker = absl::GetFlag(FLAGS_worker);
  const int num_workers = absl::GetFlag(FLAGS_num_workers);
  const int threads = absl::GetFlag(FLAGS_threads);
  const std::string progress = absl::GetFlag(FLAGS_progress);
  if (absl::Status s = CheckFlags(servers); !s.ok()) return s;
  absl::StatusOr<RecalMode> recal_mode =
      ParseRecalMode(absl::GetFlag(FLAGS_recal_mode));
  if (!recal_mode.ok()) return recal_mode.status();
  nn::ModelOptions model_options;
  absl::StatusOr<nn::Architecture> architecture =
      nn::ParseArchitecture(absl::GetFlag(FLAGS_model));
  if (!architecture.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model: ", architecture.status().message()));
  }
  model_options.architecture = *architecture;
  model_options.depth = absl::GetFlag(FLAGS_depth);
  model_options.width = absl::GetFlag(FLAGS_width);
  if (absl::Status s = nn::ValidateModelOptions(model_options); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--depth/--width: ", s.message()));
  }
  const std::string report_path = absl::GetFlag(FLAGS_report);
  if (!report_path.empty()) {  // fail now rather than after training
    std::ofstream probe(report_path);
    if (!probe) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write the report to ", report_path));
    }
  }
  // Unreadable certificates or token: fail before loading anything.
  absl::StatusOr<security::ClientSecurity> client_security =
      security::SecurityFromFlags();
  if (!client_security.ok()) return client_security.status();
  omp_set_num_threads(threads);
  const double metrics_linger = absl::GetFlag(FLAGS_metrics_linger_s);
  if (absl::Status s = metrics::CheckMetricsFlags(); !s.ok()) return s;
  if (!(metrics_linger >= 0) || !std::isfinite(metrics_linger)) {
    return absl::InvalidArgumentError(
        "--metrics_linger_s must be >= 0 and finite");
  }
  // The first line: where this worker trains, and why.
  absl::StatusOr<DeviceChoice> devices = ChooseWorkerDevices();
  if (!devices.ok()) return devices.status();
  std::printf("bnps_worker %d/%d: device %s: %s\n", worker, num_workers,
              devices->Describe().c_str(), devices->reason.c_str());
  std::fflush(stdout);
  // Measured always (it costs a few atomic adds per step and BN call);
  // served only with --metrics_port.
  metrics::Registry registry;
  WorkerMetrics worker_metrics(&registry);
  absl::StatusOr<std::unique_ptr<metrics::HttpEndpoint>> started =
      metrics::StartEndpointFromFlags(&registry);
  if (!started.ok()) return started.status();
  std::unique_ptr<metrics::HttpEndpoint> endpoint = *std::move(started);
  if (endpoint != nullptr) {
    std::printf("bnps_worker %d/%d: metrics at http://%s:%d/metrics\n", worker,
                num_workers, metrics::MetricsAddress().c_str(),
                endpoint->port());
  }
  // After training (or a failure), a last scrape may still come.
  struct Linger {
    const metrics::HttpEndpoint* endpoint;
    double seconds;
    ~Linger() {
      if (endpoint != nullptr && seconds > 0) {
        std::fflush(stdout);
        absl::SleepFor(absl::Seconds(seconds));
      }
    }
  } linger{endpoint.get(), metrics_linger};

  absl::StatusOr<Data> data = LoadData();
  if (!data.ok()) return data.status();
  // One backend per replica; the first model's is backends[0].
  const int replicas = absl::GetFlag(FLAGS_replicas);
  std::vector<std::unique_ptr<nn::Backend>> backends;
  for (int i = 0; i < replicas; ++i) {
    absl::StatusOr<std::unique_ptr<nn::Backend>> b = MakeBackend(*devices, i);
    if (!b.ok()) {
      if (i == 0) return b.status();
      return absl::Status(b.status().code(),
                          absl::StrCat("replica ", i, ": ", b.status().message()));
    }
    backends.push_back(*std::move(b));
  }

  const client::GrpcClientOptions client_options =
      ClientOptionsFromFlags(servers, *client_security, &worker_metrics);
  // Said before the wait, so a wrong address shows at once.
  std::printf("bnps_worker %d/%d: connecting to job '%s' at %s (up to %s)\n",
              worker, num_workers, client_options.job.c_str(),
              absl::StrJoin(servers, ", ").c_str(),
              absl::FormatDuration(client_options.connect_timeout).c_str());
  std::fflush(stdout);
  absl::StatusOr<std::unique_ptr<client::GrpcPsClient>> client =
      client::GrpcPsClient::Connect(client_options);
  if (absl::IsUnavailable(client.status()) ||
      absl::IsDeadlineExceeded(client.status())) {
    return absl::Status(
        client.status().code(),
        absl::StrCat(client.status().message(),
                     " (check --servers; raise --connect_timeout_s if the "
                     "servers are still starting)"));
  }
  if (proto::IsFinished(client.status())) {
    // This worker id finished the job already (a restart of a process
    // killed on its way out, say): there is nothing left to do.
    std::printf("bnps_worker %d/%d: nothing to do: %s\n", worker, num_workers,
                std::string(client.status().message()).c_str());
    return absl::OkStatus();
  }
  if (!client.ok()) return client.status();
  // The layers' running stats follow the servers' momentum: under sync the
  // worker's own copy is then the servers' bit for bit.
  model_options.bn_momentum = (*client)->config().bn_momentum();
  std::vector<std::unique_ptr<nn::Model>> models;
  for (const std::unique_ptr<nn::Backend>& b : backends) {
    absl::StatusOr<std::unique_ptr<nn::Model>> m =
        nn::Model::Create(model_options, b.get());
    if (!m.ok()) return m.status();
    models.push_back(*std::move(m));
  }
  nn::Model& model = *models[0];

  TrainerOptions options = TrainerOptionsFromFlags(*recal_mode);
  for (size_t i = 1; i < models.size(); ++i) {
    options.replicas.push_back(models[i].get());
  }
  options.metrics = &worker_metrics;
  const bool refresh =
      progress == "line" || (progress == "auto" && isatty(STDOUT_FILENO));
  auto printer = std::make_shared<ProgressPrinter>(refresh);
  if (progress != "none") {
    options.on_progress = [printer](const Progress& p) { (*printer)(p); };
  }

  std::printf(
      "bnps_worker %d/%d: policy %s, %s%s, model depth %lld width %lld (%lld "
      "weights), %lld training examples; model %s, %lld BN samples per "
      "channel per step at least\n",
      worker, num_workers, PolicyName((*client)->config()).c_str(),
      backends[0]->name().c_str(),
      replicas > 1 ? absl::StrCat(" x ", replicas, " replicas").c_str() : "",
      static_cast<long long>(model_options.depth),
      static_cast<long long>(model_options.width),
      static_cast<long long>(model.num_weights()),
      static_cast<long long>(data->train.size()),
      nn::ArchitectureName(model_options.architecture).c_str(),
      static_cast<long long>(options.batch_size *
                             model.bn_positions_per_example()));
  std::fflush(stdout);
  Trainer trainer(client->get(), &model, &data->train, &data->test,
                  options);
  absl::StatusOr<TrainReport> report;
  {
    // A call under way when the job dropped this worker runs to its
    // deadline: the watch ends the process sooner, saying why.
    const client::GrpcPsClient* c = client->get();
    DroppedWatch watch([c] { return c->heartbeat_stats().dropped; },
                       ExitDropped);
    report = trainer.Run();
  }
  printer->Finish();
  if (!report.ok()) return report.status();
  PrintResult(*report, (*client)->config(), *recal_mode);
  std::fflush(stdout);
  // The worker's last call: once every worker has left, the job is
  // complete and the servers write their final checkpoints. Training
  // succeeded either way, so a failure here is only said.
  if (absl::Status s = (*client)->Leave(); !s.ok()) {
    std::fprintf(stderr,
                 "bnps_worker %d/%d: warning: could not tell every server "
                 "that this worker finished: %s\n",
                 worker, num_workers, std::string(s.message()).c_str());
  }
  if (!report_path.empty()) {
    std::ofstream out(report_path);
    out << ReportJson(*report) << "\n";
    if (!out) {
      return absl::InternalError(
          absl::StrCat("cannot write the report to ", report_path));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace bnps::worker

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
  // Debian builds Abseil with Mutex deadlock detection on, which records a
  // lock graph at every acquisition; the tests keep it, the binaries do not.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::Status s = bnps::util::ApplyHeapFlag();
  if (s.ok()) s = bnps::worker::Main();
  if (!s.ok()) {
    // The message may quote a server's (a peer's) words.
    std::fprintf(stderr, "bnps_worker: %s\n",
                 bnps::util::EscapeForLog(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
