#include "worker/worker_main.h"

#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bn/cuda_kernels.h"
#include "client/grpc_ps_client.h"
#include "metrics/http_endpoint.h"
#include "metrics/metrics_flags.h"
#include "metrics/registry.h"
#include "nn/backend.h"
#include "nn/cpu_backend.h"
#include "nn/cuda_backend.h"
#include "nn/model.h"
#include "proto/generation.h"
#include "util/heap_flags.h"
#include "worker/console_output.h"
#include "worker/data/dataset.h"
#include "worker/data/idx.h"
#include "worker/data/synthetic.h"
#include "worker/device_choice.h"
#include "worker/dropped_watch.h"
#include "worker/trainer.h"
#include "worker/worker_metrics.h"

namespace bnps::worker {
namespace {

// Where the replicas train (worker/device_choice.h), from the request and
// CUDA's device count.
absl::StatusOr<DeviceChoice> ChooseWorkerDevices(const DeviceRequest& request) {
  std::string why;
  // No CUDA call at all for --device=cpu.
  const int count =
      request.device == "cpu" ? 0 : bn::CudaDeviceCount(&why);
  return ChooseDevices(request, count, why);
}

struct Data {
  Dataset train;
  Dataset test;
};

absl::StatusOr<Data> LoadData(const WorkerOptions& o) {
  Data d;
  if (o.data == "synthetic") {
    d.train = MakeSyntheticDataset(4096, 28, 28, 10, 1);
    d.test = MakeSyntheticDataset(1024, 28, 28, 10, 2);
    return d;
  }
  for (Split split : {Split::kTrain, Split::kTest}) {
    absl::StatusOr<Dataset> loaded = LoadFashionMnist(o.data_dir, split);
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

// One backend per replica, on the device chosen for it; the first model's
// is the first.
absl::StatusOr<std::vector<std::unique_ptr<nn::Backend>>> MakeBackends(
    const DeviceChoice& choice, int replicas) {
  std::vector<std::unique_ptr<nn::Backend>> backends;
  for (int i = 0; i < replicas; ++i) {
    absl::StatusOr<std::unique_ptr<nn::Backend>> b =
        choice.cpu() ? nn::NewCpuBackend() : nn::NewCudaBackend(choice.gpus[i]);
    if (!b.ok()) {
      if (i == 0) return b.status();
      return absl::Status(b.status().code(),
                          absl::StrCat("replica ", i, ": ", b.status().message()));
    }
    backends.push_back(*std::move(b));
  }
  return backends;
}

// Connects to the job's servers; nullptr when this worker id finished the
// job already.
absl::StatusOr<std::unique_ptr<client::GrpcPsClient>> Connect(
    const WorkerOptions& o, WorkerMetrics* worker_metrics) {
  client::GrpcClientOptions client_options = o.client;
  client_options.on_retry = [worker_metrics](absl::StatusCode code) {
    worker_metrics->Retry(code);
  };
  // Said before the wait, so a wrong address shows at once.
  std::printf("bnps_worker %d/%d: connecting to job '%s' at %s (up to %s)\n",
              o.worker, o.num_workers, client_options.job.c_str(),
              absl::StrJoin(o.servers, ", ").c_str(),
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
    std::printf("bnps_worker %d/%d: nothing to do: %s\n", o.worker,
                o.num_workers, std::string(client.status().message()).c_str());
    return nullptr;
  }
  return client;
}

// The models of the replicas, one on each backend.
absl::StatusOr<std::vector<std::unique_ptr<nn::Model>>> MakeModels(
    const nn::ModelOptions& model_options,
    const std::vector<std::unique_ptr<nn::Backend>>& backends) {
  std::vector<std::unique_ptr<nn::Model>> models;
  for (const std::unique_ptr<nn::Backend>& b : backends) {
    absl::StatusOr<std::unique_ptr<nn::Model>> m =
        nn::Model::Create(model_options, b.get());
    if (!m.ok()) return m.status();
    models.push_back(*std::move(m));
  }
  return models;
}

// The line that says what this worker trains, before it does.
void PrintSetup(const WorkerOptions& o, const proto::JobConfig& config,
                const nn::Backend& backend, const nn::Model& model,
                int64_t train_examples) {
  std::printf(
      "bnps_worker %d/%d: policy %s, %s%s, model depth %lld width %lld (%lld "
      "weights), %lld training examples; model %s, %lld BN samples per "
      "channel per step at least\n",
      o.worker, o.num_workers, ConfigPolicyName(config).c_str(),
      backend.name().c_str(),
      o.replicas > 1 ? absl::StrCat(" x ", o.replicas, " replicas").c_str()
                     : "",
      static_cast<long long>(o.model.depth),
      static_cast<long long>(o.model.width),
      static_cast<long long>(model.num_weights()),
      static_cast<long long>(train_examples),
      nn::ArchitectureName(o.model.architecture).c_str(),
      static_cast<long long>(o.trainer.batch_size *
                             model.bn_positions_per_example()));
  std::fflush(stdout);
}

// After training: the worker's last call, then the report file.
absl::Status Finish(const WorkerOptions& o, client::GrpcPsClient* client,
                    const TrainReport& report) {
  // Once every worker has left, the job is complete and the servers write
  // their final checkpoints. Training succeeded either way, so a failure
  // here is only said.
  if (absl::Status s = client->Leave(); !s.ok()) {
    std::fprintf(stderr,
                 "bnps_worker %d/%d: warning: could not tell every server "
                 "that this worker finished: %s\n",
                 o.worker, o.num_workers, std::string(s.message()).c_str());
  }
  if (!o.report_path.empty()) {
    std::ofstream out(o.report_path);
    out << ReportJson(report) << "\n";
    if (!out) {
      return absl::InternalError(
          absl::StrCat("cannot write the report to ", o.report_path));
    }
  }
  return absl::OkStatus();
}

// Connects, builds the replicas' models, trains and leaves the job.
absl::Status Train(const WorkerOptions& o, const DeviceChoice& devices,
                   const Data& data, WorkerMetrics* worker_metrics) {
  absl::StatusOr<std::vector<std::unique_ptr<nn::Backend>>> backends =
      MakeBackends(devices, o.replicas);
  if (!backends.ok()) return backends.status();
  absl::StatusOr<std::unique_ptr<client::GrpcPsClient>> client =
      Connect(o, worker_metrics);
  if (!client.ok()) return client.status();
  if (*client == nullptr) return absl::OkStatus();  // finished already
  // The layers' running stats follow the servers' momentum: under sync the
  // worker's own copy is then the servers' bit for bit.
  nn::ModelOptions model_options = o.model;
  model_options.bn_momentum = (*client)->config().bn_momentum();
  absl::StatusOr<std::vector<std::unique_ptr<nn::Model>>> models =
      MakeModels(model_options, *backends);
  if (!models.ok()) return models.status();
  nn::Model& model = *(*models)[0];

  TrainerOptions options = o.trainer;
  // OpenMP's thread count is per thread: each replica's thread sets its own.
  options.on_replica_thread = [threads = o.threads](int) {
    omp_set_num_threads(threads);
  };
  for (size_t i = 1; i < models->size(); ++i) {
    options.replicas.push_back((*models)[i].get());
  }
  options.metrics = worker_metrics;
  const bool refresh =
      o.progress == "line" || (o.progress == "auto" && isatty(STDOUT_FILENO));
  auto printer = std::make_shared<ProgressPrinter>(refresh);
  if (o.progress != "none") {
    options.on_progress = [printer](const Progress& p) { (*printer)(p); };
  }
  PrintSetup(o, (*client)->config(), *(*backends)[0], model, data.train.size());
  Trainer trainer(client->get(), &model, &data.train, &data.test, options);
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
  PrintResult(*report, (*client)->config(), o.trainer.recal_mode);
  std::fflush(stdout);
  return Finish(o, client->get(), *report);
}

}  // namespace

absl::Status PrepareWorkerProcess() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return util::ApplyHeapFlag();
}

absl::Status RunWorker(const WorkerOptions& o) {
  omp_set_num_threads(o.threads);
  // The first line: where this worker trains, and why.
  absl::StatusOr<DeviceChoice> devices = ChooseWorkerDevices(o.devices);
  if (!devices.ok()) return devices.status();
  std::printf("bnps_worker %d/%d: device %s: %s\n", o.worker, o.num_workers,
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
    std::printf("bnps_worker %d/%d: metrics at http://%s:%d/metrics\n",
                o.worker, o.num_workers, metrics::MetricsAddress().c_str(),
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
  } linger{endpoint.get(), o.metrics_linger_s};

  absl::StatusOr<Data> data = LoadData(o);
  if (!data.ok()) return data.status();
  return Train(o, *devices, *data, &worker_metrics);
}

}  // namespace bnps::worker
