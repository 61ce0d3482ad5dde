#include "worker/worker_options.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "metrics/metrics_flags.h"
#include "policy/job_flags.h"
#include "policy/policy.h"
#include "security/security_flags.h"

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
ABSL_FLAG(std::string, bn_host, "",
          "The host this worker runs on, for --bn_group=host (the servers "
          "group the workers of one host). Empty: this machine's host name; "
          "give it where that does not name the machine (in a container: its "
          "node's name, e.g. BNPS_BN_HOST from the Kubernetes downward API's "
          "spec.nodeName).");
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

GivenJobFlags GivenJobFlagsFromFlags() {
  GivenJobFlags g;
  g.policy = absl::GetFlag(FLAGS_policy);
  g.bn_policy = absl::GetFlag(FLAGS_bn_policy);
  g.gradients = absl::GetFlag(FLAGS_gradients);
  g.staleness = absl::GetFlag(FLAGS_staleness);
  g.bn_group_size = absl::GetFlag(FLAGS_bn_group_size);
  g.bn_group = absl::GetFlag(FLAGS_bn_group);
  g.bn_staleness = absl::GetFlag(FLAGS_bn_staleness);
  g.learning_rate = absl::GetFlag(FLAGS_learning_rate);
  g.momentum = absl::GetFlag(FLAGS_momentum);
  g.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  return g;
}

// The client's options from the flags; `security` from SecurityFromFlags.
client::GrpcClientOptions ClientOptionsFromFlags(
    const std::vector<std::string>& servers,
    const security::ClientSecurity& security, const GivenJobFlags& given) {
  const int num_workers = absl::GetFlag(FLAGS_num_workers);
  const int threads = absl::GetFlag(FLAGS_threads);
  const int replicas = absl::GetFlag(FLAGS_replicas);
  client::GrpcClientOptions client_options;
  client_options.servers = servers;
  client_options.credentials = security.credentials;
  client_options.token = security.token;
  client_options.job = absl::GetFlag(FLAGS_job);
  client_options.worker = absl::GetFlag(FLAGS_worker);
  client_options.num_workers = num_workers;
  client_options.host = absl::GetFlag(FLAGS_bn_host);
  client_options.connect_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
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
  client_options.check_config = [given, max_steps = absl::GetFlag(
                                            FLAGS_max_steps)](
                                     const proto::JobConfig& c) {
    absl::Status s = CheckAgainstServers(given, c);
    if (s.ok()) s = CheckRunLength(c, max_steps);
    return s;
  };
  return client_options;
}

// The trainer's options from the flags (the replicas, progress, metrics
// and threads are RunWorker's to add).
TrainerOptions TrainerOptionsFromFlags(RecalMode recal_mode) {
  const std::string eval = absl::GetFlag(FLAGS_eval);
  TrainerOptions options;
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
  options.evaluate =
      eval == "all" || (eval == "first" && absl::GetFlag(FLAGS_worker) == 0);
  options.eval_every_epoch = absl::GetFlag(FLAGS_eval_every_epoch);
  options.progress_interval =
      absl::Seconds(absl::GetFlag(FLAGS_progress_interval_s));
  return options;
}

// --model, --depth and --width.
absl::StatusOr<nn::ModelOptions> ModelOptionsFromFlags() {
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
  return model_options;
}

// Where the replicas may train: the flags and the environment.
DeviceRequest DeviceRequestFromFlags() {
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
  return request;
}

}  // namespace

std::string ConfigPolicyName(const proto::JobConfig& c) {
  absl::StatusOr<policy::JobPolicy> p = policy::FromConfig(c);
  return p.ok() ? policy::JobPolicyName(*p) : "unknown";
}

absl::Status CheckRunLength(const proto::JobConfig& config, int64_t max_steps) {
  if (!config.has_bn_staleness() || max_steps <= 0 ||
      config.bn_staleness() < max_steps) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the servers run --bn_staleness=", config.bn_staleness(),
      " but this worker trains --max_steps=", max_steps,
      ": no step would see the other workers' moments (each step t uses "
      "step t - ", config.bn_staleness(), "'s)"));
}

absl::Status CheckAgainstServers(const GivenJobFlags& given,
                                 const proto::JobConfig& c) {
  absl::StatusOr<policy::JobPolicy> mine =
      policy::ResolvePolicy(given.policy, given.bn_policy, given.gradients);
  if (!mine.ok()) return mine.status();
  absl::StatusOr<policy::JobPolicy> servers = policy::FromConfig(c);
  const std::string theirs = ConfigPolicyName(c);
  auto mismatch = [](const std::string& flag, const std::string& mine,
                     const std::string& servers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--", flag, "=", mine, " but the servers run ", flag, " ", servers,
        " (start them with the same value, or leave the flag out)"));
  };
  if (!servers.ok()) return servers.status();
  if (!given.policy.empty() && !(*mine == *servers)) {
    return mismatch("policy", given.policy, theirs);
  }
  if (!given.bn_policy.empty() && mine->bn != servers->bn) {
    return mismatch("bn_policy", given.bn_policy,
                    policy::PolicyName(servers->bn));
  }
  if (!given.gradients.empty() && mine->gradients != servers->gradients) {
    return mismatch("gradients", given.gradients,
                    policy::GradientsName(servers->gradients));
  }
  if (given.staleness.has_value() && *given.staleness != c.staleness()) {
    return mismatch("staleness", absl::StrCat(*given.staleness),
                    absl::StrCat(c.staleness()));
  }
  if (given.bn_group_size.value_or(c.bn_group_size()) != c.bn_group_size()) {
    return mismatch("bn_group_size", absl::StrCat(*given.bn_group_size),
                    absl::StrCat(c.bn_group_size()));
  }
  if (!given.bn_group.empty()) {
    absl::StatusOr<bool> by_host = policy::ParseBnGroupByHost(given.bn_group);
    if (!by_host.ok()) return by_host.status();
    if (*by_host != c.bn_group_by_host()) {
      return mismatch("bn_group", given.bn_group,
                      c.bn_group_by_host() ? "host" : "none");
    }
  }
  const int64_t bn_staleness = c.has_bn_staleness() ? c.bn_staleness() : -1;
  if (given.bn_staleness.value_or(bn_staleness) != bn_staleness) {
    return mismatch("bn_staleness", absl::StrCat(*given.bn_staleness),
                    bn_staleness < 0 ? std::string("none (the bounded mode)")
                                     : absl::StrCat(bn_staleness));
  }
  const struct {
    const char* name;
    std::optional<double> mine;
    double servers;
  } numbers[] = {
      {"learning_rate", given.learning_rate, c.learning_rate()},
      {"momentum", given.momentum, c.momentum()},
      {"weight_decay", given.weight_decay, c.weight_decay()},
  };
  for (const auto& n : numbers) {
    if (n.mine.has_value() &&
        std::abs(*n.mine - n.servers) > 1e-12 * std::abs(n.servers)) {
      return mismatch(n.name, absl::StrCat(*n.mine), absl::StrCat(n.servers));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags() {
  WorkerOptions o;
  o.servers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  if (absl::Status s = CheckFlags(o.servers); !s.ok()) return s;
  o.worker = absl::GetFlag(FLAGS_worker);
  o.num_workers = absl::GetFlag(FLAGS_num_workers);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.replicas = absl::GetFlag(FLAGS_replicas);
  o.progress = absl::GetFlag(FLAGS_progress);
  absl::StatusOr<RecalMode> recal_mode =
      ParseRecalMode(absl::GetFlag(FLAGS_recal_mode));
  if (!recal_mode.ok()) return recal_mode.status();
  absl::StatusOr<nn::ModelOptions> model = ModelOptionsFromFlags();
  if (!model.ok()) return model.status();
  o.model = *model;
  o.report_path = absl::GetFlag(FLAGS_report);
  if (!o.report_path.empty()) {  // fail now rather than after training
    std::ofstream probe(o.report_path);
    if (!probe) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write the report to ", o.report_path));
    }
  }
  // Unreadable certificates or token: fail before loading anything.
  absl::StatusOr<security::ClientSecurity> client_security =
      security::SecurityFromFlags();
  if (!client_security.ok()) return client_security.status();
  if (absl::Status s = metrics::CheckMetricsFlags(); !s.ok()) return s;
  o.metrics_linger_s = absl::GetFlag(FLAGS_metrics_linger_s);
  if (!(o.metrics_linger_s >= 0) || !std::isfinite(o.metrics_linger_s)) {
    return absl::InvalidArgumentError(
        "--metrics_linger_s must be >= 0 and finite");
  }
  o.data = absl::GetFlag(FLAGS_data);
  if (o.data != "fashion-mnist" && o.data != "synthetic") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data=", o.data, " is not one of fashion-mnist, synthetic"));
  }
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.devices = DeviceRequestFromFlags();
  o.given = GivenJobFlagsFromFlags();
  o.client = ClientOptionsFromFlags(o.servers, *client_security, o.given);
  o.trainer = TrainerOptionsFromFlags(*recal_mode);
  return o;
}

}  // namespace bnps::worker
