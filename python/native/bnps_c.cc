// The C ABI of python/native/bnps_c.h: translation only. Every rule lives in
// the client library (client/grpc_ps_client.h, client/worker_bn.h).

#include "python/native/bnps_c.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "client/grpc_ps_client.h"
#include "client/job_reader.h"
#include "client/state_export.h"
#include "client/worker_bn.h"
#include "policy/policy.h"
#include "python/native/bnps_c_internal.h"
#include "python/native/bnps_c_metrics.h"
#include "security/credentials.h"
#include "security/job_token.h"
#include "util/json_string.h"

struct bnps_arrays {
  struct Entry {
    std::string name;
    int itemsize = 8;
    std::vector<int64_t> shape;
    std::vector<double> f64;
    std::vector<float> f32;
  };
  std::vector<Entry> entries;
};

namespace {

using bnps::bn::Moments;
using bnps::bn::RunningStats;
using bnps::c_abi::Fail;
using bnps::c_abi::Get;
using bnps::c_abi::Str;

std::vector<double> Vec(const double* p, int64_t n) {
  return std::vector<double>(p, p + n);
}

absl::Status CheckChannels(int64_t channels) {
  if (channels < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("channels must be positive, not ", channels));
  }
  return absl::OkStatus();
}

Moments ToMoments(int64_t count, const double* mean, const double* m2,
                  int64_t channels) {
  Moments m;
  m.count = count;
  m.mean = Vec(mean, channels);
  m.m2 = Vec(m2, channels);
  return m;
}

// Copies `v` to `out` when it has `channels` elements.
absl::Status CopyOut(const std::vector<double>& v, int64_t channels,
                     double* out, const char* what) {
  if (static_cast<int64_t>(v.size()) != channels) {
    return absl::InternalError(absl::StrCat("the servers answered ", v.size(),
                                            " channels of ", what, " for ",
                                            channels));
  }
  std::copy(v.begin(), v.end(), out);
  return absl::OkStatus();
}

absl::Status CopyRunning(const RunningStats& r, int64_t channels,
                         double* mean, double* var) {
  if (absl::Status s = CopyOut(r.mean, channels, mean, "mean"); !s.ok()) {
    return s;
  }
  return CopyOut(r.var, channels, var, "var");
}

bnps::client::Params ToParams(int n, const char* const* names,
                              const int* ndims, const int64_t* shapes,
                              const float* const* data) {
  bnps::client::Params params;
  int64_t at = 0;
  for (int i = 0; i < n; ++i) {
    bnps::client::Param p;
    int64_t numel = 1;
    for (int d = 0; d < ndims[i]; ++d) {
      p.shape.push_back(shapes[at + d]);
      numel *= shapes[at + d];
    }
    at += ndims[i];
    p.values.assign(data[i], data[i] + numel);
    params.emplace(names[i], std::move(p));
  }
  return params;
}

using ::bnps::util::JsonString;

std::string ConfigJson(const bnps::proto::JobConfig& c) {
  absl::StatusOr<bnps::policy::JobPolicy> jp = bnps::policy::FromConfig(c);
  const std::string policy =
      jp.ok() ? bnps::policy::PolicyName(jp->bn) : "unknown";
  const std::string gradients =
      jp.ok() ? bnps::policy::GradientsName(jp->gradients) : "unknown";
  // Doubles with 17 significant digits: they read back bit for bit.
  auto num = [](double d) { return absl::StrFormat("%.17g", d); };
  return absl::StrCat(
      "{\"job\": ", JsonString(c.job()), ", \"num_workers\": ",
      c.num_workers(), ", \"num_shards\": ", c.num_shards(),
      ", \"policy\": ", JsonString(policy), ", \"gradients\": ",
      JsonString(gradients), ", \"staleness\": ", c.staleness(),
      ", \"bn_group_size\": ", c.bn_group_size(),
      ", \"bn_staleness\": ", c.has_bn_staleness() ? c.bn_staleness() : -1,
      ", \"learning_rate\": ", num(c.learning_rate()), ", \"momentum\": ",
      num(c.momentum()), ", \"weight_decay\": ", num(c.weight_decay()),
      ", \"bn_momentum\": ", num(c.bn_momentum()),
      ", \"barrier_timeout_ms\": ", c.barrier_timeout_ms(),
      ", \"heartbeat_timeout_ms\": ", c.heartbeat_timeout_ms(), "}");
}

// The job token (from `token_file`) and TLS credentials (from the three
// files) a caller asked for; empty strings leave each off.
absl::Status ReadSecurity(const char* token_file, const char* tls_ca,
                          const char* tls_cert, const char* tls_key,
                          std::string* token,
                          std::shared_ptr<grpc::ChannelCredentials>* creds) {
  if (!Str(token_file).empty()) {
    absl::StatusOr<std::string> t =
        bnps::security::ReadTokenFile(Str(token_file));
    if (!t.ok()) return t.status();
    *token = *std::move(t);
  }
  bnps::security::TlsFiles tls{Str(tls_cert), Str(tls_key), Str(tls_ca)};
  if (bnps::security::UsesTls(tls)) {
    auto c = bnps::security::MakeChannelCredentials(tls);
    if (!c.ok()) return c.status();
    *creds = *std::move(c);
  }
  return absl::OkStatus();
}

}  // namespace

extern "C" {

int bnps_api_version(void) { return BNPS_C_API_VERSION; }

const char* bnps_status_name(int code) {
  static const char* const kNames[] = {
      "OK",           "CANCELLED",          "UNKNOWN",
      "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION", "ABORTED",     "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",          "UNAVAILABLE",
      "DATA_LOSS",    "UNAUTHENTICATED"};
  if (code < 0 || code > 16) return "UNKNOWN";
  return kNames[code];
}

int64_t bnps_arrays_size(const bnps_arrays* a) {
  return static_cast<int64_t>(a->entries.size());
}
const char* bnps_arrays_name(const bnps_arrays* a, int64_t i) {
  return a->entries[i].name.c_str();
}
int bnps_arrays_itemsize(const bnps_arrays* a, int64_t i) {
  return a->entries[i].itemsize;
}
int bnps_arrays_ndim(const bnps_arrays* a, int64_t i) {
  return static_cast<int>(a->entries[i].shape.size());
}
void bnps_arrays_shape(const bnps_arrays* a, int64_t i, int64_t* shape) {
  const auto& s = a->entries[i].shape;
  std::copy(s.begin(), s.end(), shape);
}
int64_t bnps_arrays_numel(const bnps_arrays* a, int64_t i) {
  const auto& e = a->entries[i];
  return static_cast<int64_t>(e.itemsize == 4 ? e.f32.size() : e.f64.size());
}
void bnps_arrays_copy(const bnps_arrays* a, int64_t i, void* dst) {
  const auto& e = a->entries[i];
  if (e.itemsize == 4) {
    std::memcpy(dst, e.f32.data(), e.f32.size() * sizeof(float));
  } else {
    std::memcpy(dst, e.f64.data(), e.f64.size() * sizeof(double));
  }
}
void bnps_arrays_free(bnps_arrays* a) { delete a; }

int bnps_client_connect(const char* servers, const char* job, int worker,
                        int num_workers, const char* token_file,
                        const char* tls_ca, const char* tls_cert,
                        const char* tls_key, double connect_timeout_s,
                        double rpc_timeout_s, bnps_client** out, char* err,
                        size_t err_len) {
  return bnps_client_connect2(servers, job, worker, num_workers, token_file,
                              tls_ca, tls_cert, tls_key, connect_timeout_s,
                              rpc_timeout_s, 0, out, err, err_len);
}

int bnps_client_connect2(const char* servers, const char* job, int worker,
                         int num_workers, const char* token_file,
                         const char* tls_ca, const char* tls_cert,
                         const char* tls_key, double connect_timeout_s,
                         double rpc_timeout_s, int bn_spin_us,
                         bnps_client** out, char* err, size_t err_len) {
  return bnps_client_connect3(servers, job, worker, num_workers, token_file,
                              tls_ca, tls_cert, tls_key, connect_timeout_s,
                              rpc_timeout_s, bn_spin_us, nullptr, out, err,
                              err_len);
}

int bnps_client_connect3(const char* servers, const char* job, int worker,
                         int num_workers, const char* token_file,
                         const char* tls_ca, const char* tls_cert,
                         const char* tls_key, double connect_timeout_s,
                         double rpc_timeout_s, int bn_spin_us,
                         const char* bn_host_aggregator, bnps_client** out,
                         char* err, size_t err_len) {
  bnps::client::GrpcClientOptions o;
  o.bn_host_aggregator = Str(bn_host_aggregator);
  o.servers = absl::StrSplit(Str(servers), ',', absl::SkipEmpty());
  o.job = Str(job);
  o.worker = worker;
  o.num_workers = num_workers;
  o.connect_timeout = absl::Seconds(connect_timeout_s);
  o.rpc_timeout = absl::Seconds(rpc_timeout_s);
  absl::StatusOr<absl::Duration> spin =
      bnps::client::GrpcClientOptions::BnSpinFromUs(
          bn_spin_us, static_cast<int64_t>(num_workers) +
                          static_cast<int64_t>(o.servers.size()));
  BNPS_RETURN_IF_ERROR(spin.status());
  o.bn_spin = *spin;
  BNPS_RETURN_IF_ERROR(ReadSecurity(token_file, tls_ca, tls_cert, tls_key,
                                    &o.token, &o.credentials));
  auto metrics = std::make_shared<bnps::c_abi::ClientMetrics>();
  bnps::c_abi::ClientMetrics::Attach(metrics, &o);
  absl::StatusOr<std::unique_ptr<bnps::client::GrpcPsClient>> c =
      bnps::client::GrpcPsClient::Connect(std::move(o));
  BNPS_RETURN_IF_ERROR(c.status());
  auto* h = new bnps_client;
  h->metrics = std::move(metrics);
  {
    absl::MutexLock lock(&h->mu);
    h->client = *std::move(c);
  }
  *out = h;
  return 0;
}

void bnps_client_close(bnps_client* c) {
  std::shared_ptr<bnps::client::GrpcPsClient> gone;
  {
    absl::MutexLock lock(&c->mu);
    gone = std::move(c->client);
    c->client = nullptr;
  }
  // Destroyed here, outside the lock, unless a call in flight holds it.
}

int bnps_client_closed(bnps_client* c) {
  absl::MutexLock lock(&c->mu);
  return c->client == nullptr;
}

void bnps_client_free(bnps_client* c) {
  if (c == nullptr) return;
  bnps_client_close(c);
  delete c;
}

int bnps_client_config_json(bnps_client* c, char* buf, size_t len, char* err,
                            size_t err_len) {
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  const std::string json = ConfigJson((*client)->config());
  if (json.size() + 1 > len) {
    return Fail(absl::ResourceExhaustedError(absl::StrCat(
                    "the config needs ", json.size() + 1, " bytes")),
                err, err_len);
  }
  std::memcpy(buf, json.c_str(), json.size() + 1);
  return 0;
}

int bnps_client_live_workers(bnps_client* c, int* ids, int cap, int* n,
                             char* err, size_t err_len) {
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  const std::vector<int> live = (*client)->LiveWorkers();
  *n = static_cast<int>(live.size());
  std::copy_n(live.begin(), std::min<size_t>(live.size(), std::max(cap, 0)),
              ids);
  return 0;
}

int bnps_client_bn_forward(bnps_client* c, const char* layer, int64_t step,
                           int64_t count, const double* mean, const double* m2,
                           int64_t channels, int want_running,
                           int64_t* out_count, double* out_mean,
                           double* out_m2, int* has_running, double* run_mean,
                           double* run_var, int* contributors, char* err,
                           size_t err_len) {
  BNPS_RETURN_IF_ERROR(CheckChannels(channels));
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  absl::StatusOr<bnps::client::BnForwardResult> r = (*client)->BnForward(
      Str(layer), step, ToMoments(count, mean, m2, channels),
      want_running != 0);
  BNPS_RETURN_IF_ERROR(r.status());
  BNPS_RETURN_IF_ERROR(CopyOut(r->merged.mean, channels, out_mean, "mean"));
  BNPS_RETURN_IF_ERROR(CopyOut(r->merged.m2, channels, out_m2, "m2"));
  *out_count = r->merged.count;
  *contributors = r->contributors;
  *has_running = r->running.has_value();
  if (r->running.has_value()) {
    BNPS_RETURN_IF_ERROR(CopyRunning(*r->running, channels, run_mean, run_var));
  }
  return 0;
}

int bnps_client_bn_backward(bnps_client* c, const char* layer, int64_t step,
                            const double* sum_dy, const double* sum_dy_xhat,
                            int64_t channels, double* out_sum_dy,
                            double* out_sum_dy_xhat, char* err,
                            size_t err_len) {
  BNPS_RETURN_IF_ERROR(CheckChannels(channels));
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  bnps::bn::BackwardSums local{Vec(sum_dy, channels),
                               Vec(sum_dy_xhat, channels)};
  absl::StatusOr<bnps::bn::BackwardSums> r =
      (*client)->BnBackward(Str(layer), step, local);
  BNPS_RETURN_IF_ERROR(r.status());
  BNPS_RETURN_IF_ERROR(CopyOut(r->sum_dy, channels, out_sum_dy, "sum_dy"));
  return Fail(
      CopyOut(r->sum_dy_xhat, channels, out_sum_dy_xhat, "sum_dy_xhat"), err,
      err_len);
}

int bnps_client_bn_recal(bnps_client* c, const char* layer, int64_t batch,
                         int64_t count, const double* mean, const double* m2,
                         int64_t channels, char* err, size_t err_len) {
  BNPS_RETURN_IF_ERROR(CheckChannels(channels));
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  return Fail((*client)->BnRecal(Str(layer), batch,
                                 ToMoments(count, mean, m2, channels)),
              err, err_len);
}

int bnps_client_bn_recal_finish(bnps_client* c, const char* layer,
                                bnps_arrays** out, char* err, size_t err_len) {
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  absl::StatusOr<RunningStats> r = (*client)->BnRecalFinish(Str(layer));
  BNPS_RETURN_IF_ERROR(r.status());
  auto* a = new bnps_arrays;
  for (auto [name, v] : {std::pair<const char*, std::vector<double>*>{
                             "mean", &r->mean},
                         {"var", &r->var}}) {
    bnps_arrays::Entry e;
    e.name = name;
    e.shape = {static_cast<int64_t>(v->size())};
    e.f64 = std::move(*v);
    a->entries.push_back(std::move(e));
  }
  *out = a;
  return 0;
}

int bnps_client_bn_local_running(bnps_client* c, const char* layer,
                                 const double* mean, const double* var,
                                 int64_t channels, double* out_mean,
                                 double* out_var, char* err, size_t err_len) {
  BNPS_RETURN_IF_ERROR(CheckChannels(channels));
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  RunningStats running{Vec(mean, channels), Vec(var, channels)};
  absl::StatusOr<RunningStats> r =
      (*client)->BnLocalRunning(Str(layer), running);
  BNPS_RETURN_IF_ERROR(r.status());
  return Fail(CopyRunning(*r, channels, out_mean, out_var), err, err_len);
}

int bnps_client_bn_running(bnps_client* c, const char* layer,
                           int64_t channels, double* out_mean, double* out_var,
                           char* err, size_t err_len) {
  BNPS_RETURN_IF_ERROR(CheckChannels(channels));
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  absl::StatusOr<RunningStats> r = (*client)->BnRunning(Str(layer), channels);
  BNPS_RETURN_IF_ERROR(r.status());
  return Fail(CopyRunning(*r, channels, out_mean, out_var), err, err_len);
}

int bnps_client_start_step(bnps_client* c, int64_t step, int64_t* out,
                           char* err, size_t err_len) {
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  absl::StatusOr<int64_t> r = (*client)->StartStep(step);
  BNPS_RETURN_IF_ERROR(r.status());
  *out = *r;
  return 0;
}

int bnps_client_finish_step(bnps_client* c, int64_t completed, char* err,
                            size_t err_len) {
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  return Fail((*client)->FinishStep(completed), err, err_len);
}

namespace {

// Whether the job's workers bracket their steps with StartStep and
// FinishStep: under async gradients only.
absl::StatusOr<bool> BracketsSteps(const bnps::client::GrpcPsClient& client) {
  absl::StatusOr<bnps::policy::JobPolicy> p =
      bnps::policy::FromConfig(client.config());
  if (!p.ok()) return p.status();
  return !bnps::policy::BulkSynchronous(p->gradients);
}

}  // namespace

int bnps_client_begin_step(bnps_client* c, int64_t step, int64_t* out,
                           char* err, size_t err_len) {
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  absl::StatusOr<bool> brackets = BracketsSteps(**client);
  BNPS_RETURN_IF_ERROR(brackets.status());
  if (*brackets) return bnps_client_start_step(c, step, out, err, err_len);
  *out = step;
  return 0;
}

int bnps_client_end_step(bnps_client* c, int64_t completed, char* err,
                         size_t err_len) {
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  absl::StatusOr<bool> brackets = BracketsSteps(**client);
  BNPS_RETURN_IF_ERROR(brackets.status());
  if (*brackets) return bnps_client_finish_step(c, completed, err, err_len);
  return 0;
}

int bnps_client_leave(bnps_client* c, char* err, size_t err_len) {
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  return Fail((*client)->Leave(), err, err_len);
}

int bnps_export(const char* servers, const char* path, const char* job,
                const char* token_file, const char* tls_ca,
                const char* tls_cert, const char* tls_key, double timeout_s,
                char* json, size_t len, char* err, size_t err_len) {
  bnps::client::JobReaderOptions o;
  o.servers = absl::StrSplit(Str(servers), ',', absl::SkipEmpty());
  o.job = Str(job);
  o.timeout = absl::Seconds(timeout_s);
  BNPS_RETURN_IF_ERROR(ReadSecurity(token_file, tls_ca, tls_cert, tls_key,
                                    &o.token, &o.credentials));
  absl::StatusOr<std::unique_ptr<bnps::client::JobReader>> reader =
      bnps::client::JobReader::Create(std::move(o));
  BNPS_RETURN_IF_ERROR(reader.status());
  absl::StatusOr<bnps::client::JobState> state = (*reader)->ReadState();
  BNPS_RETURN_IF_ERROR(state.status());
  BNPS_RETURN_IF_ERROR(bnps::client::WriteExport(*state, Str(path)));
  const std::string out = absl::StrFormat(
      "{\"step\": %d, \"job_complete\": %s, \"parameters\": %d, "
      "\"bn_layers\": %d}",
      state->step, state->job_complete ? "true" : "false",
      state->params.size(), state->running.size());
  if (out.size() + 1 > len) {
    return Fail(absl::ResourceExhaustedError(absl::StrCat(
                    "the summary needs ", out.size() + 1, " bytes")),
                err, err_len);
  }
  std::memcpy(json, out.c_str(), out.size() + 1);
  return 0;
}

int bnps_client_init_parameters(bnps_client* c, int n,
                                const char* const* names, const int* ndims,
                                const int64_t* shapes,
                                const float* const* data, char* err,
                                size_t err_len) {
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  return Fail((*client)->InitParameters(
                  ToParams(n, names, ndims, shapes, data)),
              err, err_len);
}

int bnps_client_push_gradients(bnps_client* c, int64_t step,
                               int64_t num_samples, int n,
                               const char* const* names, const int* ndims,
                               const int64_t* shapes, const float* const* data,
                               char* err, size_t err_len) {
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  auto p = std::make_shared<const bnps::client::Params>(
      ToParams(n, names, ndims, shapes, data));
  return Fail((*client)->PushGradients(step, num_samples, std::move(p)), err,
              err_len);
}

int bnps_client_pull(bnps_client* c, int64_t min_version, int n_keys,
                     const char* const* keys, bnps_arrays** out, char* err,
                     size_t err_len) {
  auto client = Get(c);
  BNPS_RETURN_IF_ERROR(client.status());
  absl::StatusOr<bnps::client::Params> r;
  if (n_keys == 0) {
    r = (*client)->PullParameters(min_version);
  } else {
    std::vector<std::string> k(keys, keys + n_keys);
    r = (*client)->PullParameters(k, min_version);
  }
  BNPS_RETURN_IF_ERROR(r.status());
  auto* a = new bnps_arrays;
  for (auto& [name, p] : *r) {
    bnps_arrays::Entry e;
    e.name = name;
    e.itemsize = 4;
    e.shape = p.shape;
    e.f32 = std::move(p.values);
    a->entries.push_back(std::move(e));
  }
  *out = a;
  return 0;
}

int bnps_worker_bn_new(const char* policy, double job_bn_momentum,
                       bnps_worker_bn** out, char* err, size_t err_len) {
  absl::StatusOr<bnps::policy::Policy> p =
      bnps::policy::ParsePolicy(Str(policy));
  BNPS_RETURN_IF_ERROR(p.status());
  *out = new bnps_worker_bn{bnps::client::WorkerBn(*p, job_bn_momentum)};
  return 0;
}

void bnps_worker_bn_free(bnps_worker_bn* r) { delete r; }

int bnps_worker_bn_check_layer(const bnps_worker_bn* r, const char* layer,
                               int tracks_running, int has_momentum,
                               double momentum, char* err, size_t err_len) {
  std::optional<double> m;
  if (has_momentum) m = momentum;
  return Fail(r->rule.CheckLayer(Str(layer), tracks_running != 0, m), err,
              err_len);
}

void bnps_worker_bn_plan_forward(const bnps_worker_bn* r, int tracks_running,
                                 int* exchange, int* want_running) {
  const bnps::client::BnForwardPlan plan =
      r->rule.PlanForward(tracks_running != 0);
  *exchange = plan.exchange;
  *want_running = plan.want_running;
}

int bnps_worker_bn_resolve(const bnps_worker_bn* r, int64_t count,
                           const double* mean, const double* m2,
                           int64_t channels, int has_answer,
                           int64_t answer_count, const double* answer_mean,
                           const double* answer_m2, int answer_has_running,
                           int64_t* out_count, double* out_mean,
                           double* out_m2, int* global_backward,
                           int* running_update, char* err, size_t err_len) {
  BNPS_RETURN_IF_ERROR(CheckChannels(channels));
  std::optional<bnps::client::BnForwardResult> answer;
  if (has_answer) {
    answer.emplace();
    answer->merged = ToMoments(answer_count, answer_mean, answer_m2, channels);
    // Only whether they came matters here: the caller holds them.
    if (answer_has_running) answer->running = RunningStats{};
  }
  absl::StatusOr<bnps::client::BnForwardOutcome> o =
      r->rule.Resolve(ToMoments(count, mean, m2, channels), answer);
  BNPS_RETURN_IF_ERROR(o.status());
  BNPS_RETURN_IF_ERROR(CopyOut(o->normalize.mean, channels, out_mean, "mean"));
  BNPS_RETURN_IF_ERROR(CopyOut(o->normalize.m2, channels, out_m2, "m2"));
  *out_count = o->normalize.count;
  *global_backward = o->global_backward;
  *running_update = static_cast<int>(o->running);
  return 0;
}

int bnps_worker_bn_settle(const bnps_worker_bn* r, int* settle, char* err,
                          size_t err_len) {
  absl::StatusOr<bnps::client::RunningSettle> s = r->rule.SettleRunning();
  BNPS_RETURN_IF_ERROR(s.status());
  *settle = static_cast<int>(*s);
  return 0;
}

int bnps_update_running(int64_t count, const double* mean, const double* m2,
                        int64_t channels, int has_momentum, double momentum,
                        int64_t* batches_tracked, double* running_mean,
                        double* running_var, char* err, size_t err_len) {
  BNPS_RETURN_IF_ERROR(CheckChannels(channels));
  RunningStats running{Vec(running_mean, channels), Vec(running_var, channels)};
  std::optional<double> m;
  if (has_momentum) m = momentum;
  BNPS_RETURN_IF_ERROR(bnps::client::UpdateRunning(
      ToMoments(count, mean, m2, channels), m, batches_tracked, &running));
  std::copy(running.mean.begin(), running.mean.end(), running_mean);
  std::copy(running.var.begin(), running.var.end(), running_var);
  return 0;
}

int bnps_merge_moments(int64_t count_a, const double* mean_a,
                       const double* m2_a, int64_t count_b,
                       const double* mean_b, const double* m2_b,
                       int64_t channels, int64_t* out_count, double* out_mean,
                       double* out_m2, char* err, size_t err_len) {
  BNPS_RETURN_IF_ERROR(CheckChannels(channels));
  absl::StatusOr<Moments> m =
      bnps::bn::MergeMoments({ToMoments(count_a, mean_a, m2_a, channels),
                              ToMoments(count_b, mean_b, m2_b, channels)});
  BNPS_RETURN_IF_ERROR(m.status());
  *out_count = m->count;
  std::copy(m->mean.begin(), m->mean.end(), out_mean);
  std::copy(m->m2.begin(), m->m2.end(), out_m2);
  return 0;
}

}  // extern "C"
