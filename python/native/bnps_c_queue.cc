// The C ABI's stream-ordered exchanges (python/native/bnps_c.h,
// bnps_stream_queue_*): the exchange-alone layer calls as jobs of a
// client::StreamExchanges. Translation and sequencing only.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bn/moments.h"
#include "client/stream_exchanges.h"
#include "client/worker_bn.h"
#include "python/native/bnps_c.h"
#include "python/native/bnps_c_exchange.h"
#include "python/native/bnps_c_internal.h"
#include "python/native/bnps_c_queue.h"

namespace {

// What a queued forward normalized with, for its backward pass: written by
// the forward's job, read by the backward's (later on the same stream).
struct Outcome {
  int64_t count = 0;
  std::vector<double> stats;  // 2 x channels: the mean, the biased variance
};

}  // namespace

struct bnps_outcome {
  std::shared_ptr<Outcome> outcome;
};

namespace {

using bnps::c_abi::ClientFor;
using bnps::c_abi::ClientRef;
using bnps::c_abi::Fail;
using bnps::c_abi::Str;

// A job's buffers hold float32 or float64 values.
absl::Status CheckItemsize(int itemsize, const char* what) {
  if (itemsize == 4 || itemsize == 8) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": ", itemsize, "-byte values; want 4 (float32) or 8 (float64)"));
}

// Values [first, first + n) of a buffer of `itemsize`-byte floats.
std::vector<double> Read(const void* p, int itemsize, int64_t first,
                         int64_t n) {
  std::vector<double> v(n);
  if (itemsize == 4) {
    const float* f = static_cast<const float*>(p) + first;
    std::copy(f, f + n, v.begin());
  } else {
    const double* d = static_cast<const double*>(p) + first;
    std::copy(d, d + n, v.begin());
  }
  return v;
}

// `v` into a buffer of `itemsize`-byte floats from value `first` on.
void Write(const std::vector<double>& v, void* p, int itemsize, int64_t first) {
  if (itemsize == 4) {
    float* f = static_cast<float*>(p) + first;
    for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
  } else {
    std::copy(v.begin(), v.end(), static_cast<double*>(p) + first);
  }
}

// What a forward normalizes with, as its job writes it to `rows`: the
// mean, the biased variance and 1 / sqrt(var + eps).
void WriteRows(const std::vector<double>& mean, const std::vector<double>& var,
               double eps, void* rows, int itemsize) {
  std::vector<double> inv(var.size());
  for (size_t i = 0; i < var.size(); ++i)
    inv[i] = 1.0 / std::sqrt(var[i] + eps);
  const int64_t c = static_cast<int64_t>(mean.size());
  Write(mean, rows, itemsize, 0);
  Write(var, rows, itemsize, c);
  Write(inv, rows, itemsize, 2 * c);
}

// The forward job's running outputs from the host copies (left as they are
// when the layer tracks none).
struct RunningOut {
  const double* mean;
  const double* var;
  const int64_t* tracked;
  void* running;
  int itemsize;
  int64_t* tracked_out;

  void Fill(int64_t channels) const {
    if (mean == nullptr) return;
    Write(std::vector<double>(mean, mean + channels), running, itemsize, 0);
    Write(std::vector<double>(var, var + channels), running, itemsize,
          channels);
    *tracked_out = *tracked;
  }
};

}  // namespace

extern "C" {

int bnps_stream_queue_new(int on_cuda, bnps_stream_queue** out, char* err,
                          size_t err_len) {
  *out = nullptr;
  std::unique_ptr<bnps::client::HostFuncLauncher> launcher;
  absl::StatusOr<std::unique_ptr<bnps::c_abi::DeviceOps>> device;
  if (on_cuda) {
    auto cuda = bnps::client::NewCudaHostFuncLauncher();
    BNPS_RETURN_IF_ERROR(cuda.status());
    launcher = *std::move(cuda);
    device = bnps::c_abi::NewCudaDeviceOps();
  } else {
    launcher = bnps::client::NewInlineLauncher();
    device = bnps::c_abi::NewHostDeviceOps();
  }
  *out = new bnps_stream_queue(std::move(launcher), std::move(device));
  return 0;
}

void bnps_stream_queue_free(bnps_stream_queue* q) { delete q; }

int bnps_stream_queue_drain(bnps_stream_queue* q, double timeout_s, char* err,
                            size_t err_len) {
  return Fail(q->exchanges.Drain(absl::Seconds(timeout_s)), err, err_len);
}

void bnps_stream_queue_counts(const bnps_stream_queue* q, int64_t* counts) {
  counts[0] = q->exchanges.pending();
  counts[1] = q->exchanges.completed();
  counts[2] = q->exchanges.fell_back();
}

int bnps_stream_queue_new_recording(bnps_stream_queue** out, char* err,
                                    size_t err_len) {
  std::shared_ptr<bnps::c_abi::Recorder> r = bnps::c_abi::Recorder::New();
  *out = new bnps_stream_queue(r->NewLauncher(), r->NewDeviceOps());
  (*out)->recorder = std::move(r);
  return 0;
}

int bnps_stream_queue_record(bnps_stream_queue* q, int on, int replays,
                             char* err, size_t err_len) {
  if (q->recorder == nullptr) {
    BNPS_RETURN_IF_ERROR(absl::FailedPreconditionError(
        "not a recording queue (bnps_stream_queue_new_recording)"));
  }
  q->recorder->SetRecording(on != 0);
  for (int i = 0; i < replays; ++i) q->recorder->Replay();
  return 0;
}

void bnps_stream_queue_note_wait(bnps_stream_queue* q) { ++q->layer_waits; }

void bnps_stream_queue_waits(const bnps_stream_queue* q, int64_t* waits) {
  waits[0] = q->layer_waits.load();
  waits[1] = q->exchanges.drain_waits();
}

double bnps_stream_queue_exchange_seconds(const bnps_stream_queue* q) {
  return absl::ToDoubleSeconds(q->exchanges.exchange_time());
}

int bnps_stream_queue_forward(
    bnps_stream_queue* q, void* stream, const bnps_worker_bn* r, bnps_client* c,
    const char* layer, int64_t step, int64_t count, const void* local,
    int local_itemsize, int64_t channels, double eps, int has_momentum,
    double momentum, double* running_mean, double* running_var,
    int64_t* batches_tracked, void* rows, int rows_itemsize, void* running,
    int running_itemsize, int64_t* tracked_out, int64_t* info,
    bnps_outcome** outcome, char* err, size_t err_len) {
  info[0] = info[1] = 0;
  *outcome = nullptr;
  BNPS_RETURN_IF_ERROR(bnps::c_abi::CheckChannels(channels));
  BNPS_RETURN_IF_ERROR(CheckItemsize(local_itemsize, "local moments"));
  BNPS_RETURN_IF_ERROR(CheckItemsize(rows_itemsize, "rows"));
  const bool tracks = running_mean != nullptr && running_var != nullptr;
  if (tracks) {
    if (batches_tracked == nullptr || running == nullptr ||
        tracked_out == nullptr) {
      BNPS_RETURN_IF_ERROR(absl::InvalidArgumentError(
          "running statistics without a count of the batches they tracked "
          "or somewhere to write them"));
    }
    BNPS_RETURN_IF_ERROR(CheckItemsize(running_itemsize, "running"));
  }
  const std::optional<double> m = bnps::c_abi::Momentum(has_momentum, momentum);
  const bnps::client::WorkerBn rule = r->rule;
  BNPS_RETURN_IF_ERROR(rule.CheckLayer(Str(layer), tracks, m));
  const bnps::client::BnForwardPlan plan = rule.PlanForward(tracks);
  ClientRef client;
  if (plan.exchange) {
    absl::StatusOr<ClientRef> got =
        ClientFor(c, "the policy exchanges BN statistics");
    BNPS_RETURN_IF_ERROR(got.status());
    client = *std::move(got);
  }
  const RunningOut out_running{running_mean, running_var,      batches_tracked,
                               running,      running_itemsize, tracked_out};
  auto result = std::make_shared<Outcome>();
  // The job's outputs, once it knows what to normalize with: the rows, the
  // running statistics (as the host copy now holds them) and the outcome.
  auto finish = [=](const std::vector<double>& mean,
                    const std::vector<double>& var, int64_t n) {
    WriteRows(mean, var, eps, rows, rows_itemsize);
    out_running.Fill(channels);
    result->count = n;
    result->stats = mean;
    result->stats.insert(result->stats.end(), var.begin(), var.end());
  };
  bnps::client::StreamExchanges::Job job;
  job.exchange = [=, name = Str(layer)]() -> absl::Status {
    bnps::bn::Moments moments{count, Read(local, local_itemsize, 0, channels),
                              Read(local, local_itemsize, channels, channels)};
    for (double& v : moments.m2) v *= static_cast<double>(count);
    if (absl::Status s = bnps::bn::ValidateMoments(moments); !s.ok()) return s;
    int64_t unused_info[3] = {0, 0, 0};
    absl::StatusOr<bnps::client::BnForwardOutcome> o =
        bnps::c_abi::ExchangeForward(
            rule, [&client] { return absl::StatusOr<ClientRef>(client); }, name,
            step, moments, m, running_mean, running_var, batches_tracked,
            unused_info);
    if (!o.ok()) return o.status();
    finish(o->normalize.mean, bnps::bn::BiasedVariance(o->normalize),
           o->normalize.count);
    return absl::OkStatus();
  };
  job.fallback = [=]() {  // the local statistics, the running ones as they are
    finish(Read(local, local_itemsize, 0, channels),
           Read(local, local_itemsize, channels, channels), count);
  };
  BNPS_RETURN_IF_ERROR(q->exchanges.Enqueue(stream, std::move(job)));
  info[0] = plan.exchange;
  info[1] = plan.exchange && rule.GlobalBackward();
  *outcome = new bnps_outcome{std::move(result)};
  return 0;
}

int bnps_stream_queue_backward(bnps_stream_queue* q, void* stream,
                               bnps_client* c, const char* layer, int64_t step,
                               const void* in, int in_itemsize, int has_weight,
                               int64_t channels, const bnps_outcome* outcome,
                               double eps, void* k, int k_itemsize, char* err,
                               size_t err_len) {
  BNPS_RETURN_IF_ERROR(bnps::c_abi::CheckChannels(channels));
  BNPS_RETURN_IF_ERROR(CheckItemsize(in_itemsize, "sums"));
  const std::string name = Str(layer);
  if (name.empty() && k == nullptr) return 0;
  if (k != nullptr) {
    BNPS_RETURN_IF_ERROR(CheckItemsize(k_itemsize, "k"));
    if (outcome == nullptr) {
      BNPS_RETURN_IF_ERROR(
          absl::InvalidArgumentError("dx's map needs the forward's outcome"));
    }
  }
  ClientRef client;
  if (!name.empty()) {
    absl::StatusOr<ClientRef> got = ClientFor(c, "a backward exchange");
    BNPS_RETURN_IF_ERROR(got.status());
    client = *std::move(got);
  }
  std::shared_ptr<const Outcome> forward =
      outcome == nullptr ? nullptr : outcome->outcome;
  auto local_sums = [=]() {
    return bnps::bn::BackwardSums{Read(in, in_itemsize, 0, channels),
                                  Read(in, in_itemsize, channels, channels)};
  };
  // dx's map from `sums` into k.
  auto write_k = [=](const bnps::bn::BackwardSums& sums) {
    std::vector<double> weight;
    if (has_weight) weight = Read(in, in_itemsize, 2 * channels, channels);
    std::vector<double> out(3 * channels);
    absl::Status s = bnps::c_abi::WriteInputGradient(
        forward->stats.data(), has_weight ? weight.data() : nullptr, channels,
        eps, sums, forward->count, out.data());
    if (!s.ok()) std::fill(out.begin(), out.end(), 0.0);
    Write(out, k, k_itemsize, 0);
    return s;
  };
  bnps::client::StreamExchanges::Job job;
  job.exchange = [=]() -> absl::Status {
    bnps::bn::BackwardSums sums = local_sums();
    if (client != nullptr) {
      if (absl::Status s =
              bnps::c_abi::BackwardExchange(*client, name, step, &sums);
          !s.ok()) {
        return s;
      }
    }
    return k == nullptr ? absl::OkStatus() : write_k(sums);
  };
  job.fallback = [=]() {
    if (k != nullptr) write_k(local_sums()).IgnoreError();
  };
  return Fail(q->exchanges.Enqueue(stream, std::move(job)), err, err_len);
}

void bnps_outcome_free(bnps_outcome* o) { delete o; }

}  // extern "C"
