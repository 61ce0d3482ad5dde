// The C ABI's device layer passes (python/native/bnps_c.h,
// bnps_device_pass_*): per layer pass, the copies of the local statistics
// to pinned host buffers, the exchange as a job of the queue's
// client::StreamExchanges, and the copies of its results to the device,
// all queued on the caller's stream through a DeviceOps (bnps_c_device.h).
// Translation and sequencing only: the rules are client/worker_bn.h's.

#include <atomic>
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
#include "bn/moments.h"
#include "client/stream_exchanges.h"
#include "client/worker_bn.h"
#include "python/native/bnps_c.h"
#include "python/native/bnps_c_device.h"
#include "python/native/bnps_c_exchange.h"
#include "python/native/bnps_c_internal.h"
#include "python/native/bnps_c_queue.h"

namespace {

using bnps::c_abi::ClientRef;
using bnps::c_abi::DeviceOps;
using bnps::c_abi::Fail;

double At(const char* p, int itemsize, int64_t i) {
  return itemsize == 4 ? reinterpret_cast<const float*>(p)[i]
                       : reinterpret_cast<const double*>(p)[i];
}

void Put(char* p, int itemsize, int64_t i, double v) {
  if (itemsize == 4) {
    reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
  } else {
    reinterpret_cast<double*>(p)[i] = v;
  }
}

// A layer's passes: what they are made with, the host state their jobs
// update (running statistics, step counters: advanced when a job RUNS, so
// a replayed CUDA graph makes new steps) and the pinned buffers the copies
// go through. Jobs of one stream run one at a time, in order.
struct PassState {
  explicit PassState(const bnps::client::WorkerBn& r) : rule(r) {}

  const bnps::client::WorkerBn rule;
  ClientRef client;  // null where the policy never exchanges
  std::string layer;
  int64_t channels = 0;
  double eps = 0;
  std::optional<double> momentum;
  int itemsize = 4;          // the statistics' and sums' values
  int running_itemsize = 8;  // the layer's running buffers' values
  bool tracks = false;
  bool exchange = false;         // the forward exchanges
  bool global_backward = false;  // so does the backward
  void* running_mean_out = nullptr;  // the layer's buffers (device)
  void* running_var_out = nullptr;
  void* tracked_out = nullptr;
  std::vector<double> running_mean, running_var;  // float64 host copies
  int64_t tracked = 0;
  std::atomic<int64_t> step{0}, backward_step{0};
  // Pinned host buffers (DeviceOps::HostBuffer).
  char* in = nullptr;    // 2 x C: the local mean, 1 / sqrt(biased var)
  char* rows = nullptr;  // 2 x C: the mean and 1 / sqrt(var + eps) to use
  int32_t* count = nullptr;  // the samples they describe
  char* running = nullptr;   // 2 x C running_itemsize: mean, var
  int64_t* tracked_host = nullptr;
  char* sums = nullptr;  // 2 x C: sum(dy), sum(dy * (x - mean))
  char* invstd = nullptr;  // C: the backward's forward's 1 / sqrt(var + eps)

  size_t bytes() const { return channels * itemsize; }

  // The buffers' outputs once the pass knows what to normalize with.
  void Finish(const std::vector<double>& mean, const std::vector<double>& var,
              int64_t n) {
    for (int64_t i = 0; i < channels; ++i) {
      Put(rows, itemsize, i, mean[i]);
      Put(rows, itemsize, channels + i, 1.0 / std::sqrt(var[i] + eps));
    }
    *count = static_cast<int32_t>(n);
    if (!tracks) return;
    for (int64_t i = 0; i < channels; ++i) {
      Put(running, running_itemsize, i, running_mean[i]);
      Put(running, running_itemsize, channels + i, running_var[i]);
    }
    *tracked_host = tracked;
  }

  // The local moments of `n` samples from `in`.
  bnps::bn::Moments Local(int64_t n) const {
    bnps::bn::Moments m{n, std::vector<double>(channels),
                        std::vector<double>(channels)};
    for (int64_t i = 0; i < channels; ++i) {
      m.mean[i] = At(in, itemsize, i);
      const double s = At(in, itemsize, channels + i);  // inf: var 0
      m.m2[i] = static_cast<double>(n) / (s * s);
    }
    return m;
  }

  absl::Status ForwardJob(int64_t n) {
    const bnps::bn::Moments local = Local(n);
    if (absl::Status s = bnps::bn::ValidateMoments(local); !s.ok()) return s;
    int64_t info[3] = {0, 0, 0};
    const int64_t at = step.load();
    absl::StatusOr<bnps::client::BnForwardOutcome> o =
        bnps::c_abi::ExchangeForward(
            rule, [this] { return absl::StatusOr<ClientRef>(client); }, layer,
            at, local, momentum, tracks ? running_mean.data() : nullptr,
            tracks ? running_var.data() : nullptr, &tracked, info);
    if (info[1]) step.store(at + 1);
    if (!o.ok()) return o.status();
    Finish(o->normalize.mean, bnps::bn::BiasedVariance(o->normalize),
           o->normalize.count);
    return absl::OkStatus();
  }

  void ForwardFallback(int64_t n) {  // the local statistics
    const bnps::bn::Moments local = Local(n);
    Finish(local.mean, bnps::bn::BiasedVariance(local), n);
  }

  absl::Status BackwardJob() {
    bnps::bn::BackwardSums s{std::vector<double>(channels),
                             std::vector<double>(channels)};
    for (int64_t i = 0; i < channels; ++i) {
      s.sum_dy[i] = At(sums, itemsize, i);
      // The servers sum sum(dy * x_hat), as every route sends it.
      s.sum_dy_xhat[i] =
          At(sums, itemsize, channels + i) * At(invstd, itemsize, i);
    }
    const int64_t at = backward_step.fetch_add(1);
    if (absl::Status st =
            bnps::c_abi::BackwardExchange(*client, layer, at, &s);
        !st.ok()) {
      return st;  // (the local sums stay in the buffer: the fallback)
    }
    for (int64_t i = 0; i < channels; ++i) {
      Put(sums, itemsize, i, s.sum_dy[i]);
      Put(sums, itemsize, channels + i,
          s.sum_dy_xhat[i] / At(invstd, itemsize, i));
    }
    return absl::OkStatus();
  }
};

absl::Status CheckItemsize(int itemsize, const char* what) {
  if (itemsize == 4 || itemsize == 8) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": ", itemsize, "-byte values; want 4 (float32) or 8 (float64)"));
}

size_t Aligned(size_t n) { return (n + 15) / 16 * 16; }

// The pinned buffers of `s`, in one allocation.
absl::Status MakeBuffers(DeviceOps& d, PassState& s) {
  const size_t stats = Aligned(2 * s.bytes());
  const size_t running = Aligned(2 * s.channels * s.running_itemsize);
  absl::StatusOr<void*> got = d.HostBuffer(4 * stats + running + 32);
  if (!got.ok()) return got.status();
  char* p = static_cast<char*>(*got);
  s.in = p;
  s.rows = p + stats;
  s.sums = p + 2 * stats;
  s.invstd = p + 3 * stats;
  s.running = p + 4 * stats;
  s.count = reinterpret_cast<int32_t*>(p + 4 * stats + running);
  s.tracked_host = reinterpret_cast<int64_t*>(p + 4 * stats + running + 16);
  return absl::OkStatus();
}

// Queues `job` on `stream`: to be replayed where the stream captures
// (*captured then).
absl::Status Queue(bnps_stream_queue* q, DeviceOps& d, void* stream,
                   bnps::client::StreamExchanges::Job job,
                   int64_t* captured = nullptr) {
  absl::StatusOr<bool> capturing = d.Capturing(stream);
  if (!capturing.ok()) return capturing.status();
  if (captured != nullptr) *captured = *capturing;
  return *capturing ? q->exchanges.EnqueueReplayable(stream, std::move(job))
                    : q->exchanges.Enqueue(stream, std::move(job));
}

}  // namespace

struct bnps_device_pass {
  bnps_stream_queue* queue;
  std::shared_ptr<PassState> state;  // shared with the queued jobs
};

namespace {

// A forward pass (bnps_device_call_forward's contract): what to normalize
// with goes back into `mean` and `invstd`, as the copies back follow the
// copies out in the stream's order.
absl::Status QueueForward(bnps_device_pass* p, void* stream, int64_t count,
                          void* mean, void* invstd, void* count_out,
                          int64_t* info) {
  if (count < 1 || count > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        count, " samples per channel: a device pass takes 1 to 2^31 - 1"));
  }
  DeviceOps& d = **p->queue->device;
  std::shared_ptr<PassState> s = p->state;
  const size_t bytes = s->bytes();
  bnps::client::StreamExchanges::Job job;
  job.exchange = [s, count] { return s->ForwardJob(count); };
  job.fallback = [s, count] { s->ForwardFallback(count); };
  absl::Status st = d.ToHost(stream, s->in, mean, bytes);
  if (st.ok()) st = d.ToHost(stream, s->in + bytes, invstd, bytes);
  if (st.ok()) st = Queue(p->queue, d, stream, std::move(job), &info[2]);
  if (st.ok()) st = d.ToDevice(stream, mean, s->rows, bytes);
  if (st.ok()) st = d.ToDevice(stream, invstd, s->rows + bytes, bytes);
  if (st.ok()) st = d.ToDevice(stream, count_out, s->count, 4);
  if (s->tracks) {
    const size_t running = s->channels * s->running_itemsize;
    if (st.ok()) {
      st = d.ToDevice(stream, s->running_mean_out, s->running, running);
    }
    if (st.ok()) {
      st = d.ToDevice(stream, s->running_var_out, s->running + running,
                      running);
    }
    if (st.ok()) st = d.ToDevice(stream, s->tracked_out, s->tracked_host, 8);
  }
  if (!st.ok()) return st;
  info[0] = s->exchange;
  info[1] = s->global_backward;
  return absl::OkStatus();
}

// A backward pass (bnps_device_call_backward's contract).
absl::Status QueueBackward(bnps_device_pass* p, void* stream,
                           const void* invstd, void* sum_dy,
                           void* sum_dy_xmu) {
  std::shared_ptr<PassState> s = p->state;
  if (!s->global_backward) return absl::OkStatus();  // the local sums stay
  DeviceOps& d = **p->queue->device;
  const size_t bytes = s->bytes();
  bnps::client::StreamExchanges::Job job;
  job.exchange = [s] { return s->BackwardJob(); };
  job.fallback = [] {};  // the local sums stay
  absl::Status st = d.ToHost(stream, s->sums, sum_dy, bytes);
  if (st.ok()) st = d.ToHost(stream, s->sums + bytes, sum_dy_xmu, bytes);
  if (st.ok()) st = d.ToHost(stream, s->invstd, invstd, bytes);
  if (st.ok()) st = Queue(p->queue, d, stream, std::move(job));
  if (st.ok()) st = d.ToDevice(stream, sum_dy, s->sums, bytes);
  if (st.ok()) st = d.ToDevice(stream, sum_dy_xmu, s->sums + bytes, bytes);
  return st;
}

}  // namespace

extern "C" {

int bnps_device_pass_new(
    bnps_stream_queue* q, const bnps_worker_bn* r, bnps_client* c,
    const char* layer, int64_t channels, double eps, int has_momentum,
    double momentum, int itemsize, const double* running_mean,
    const double* running_var, const int64_t* batches_tracked,
    void* running_mean_out, void* running_var_out, int running_itemsize,
    void* batches_tracked_out, int64_t step, int64_t backward_step,
    bnps_device_pass** out, char* err, size_t err_len) {
  *out = nullptr;
  BNPS_RETURN_IF_ERROR(q->device.status());
  BNPS_RETURN_IF_ERROR(bnps::c_abi::CheckChannels(channels));
  BNPS_RETURN_IF_ERROR(CheckItemsize(itemsize, "statistics"));
  auto s = std::make_shared<PassState>(r->rule);
  s->tracks = running_mean != nullptr;
  if (s->tracks) {
    if (running_var == nullptr || batches_tracked == nullptr ||
        running_mean_out == nullptr || running_var_out == nullptr ||
        batches_tracked_out == nullptr) {
      BNPS_RETURN_IF_ERROR(absl::InvalidArgumentError(
          "running statistics without their variance, count of batches or "
          "the buffers to write them to"));
    }
    BNPS_RETURN_IF_ERROR(CheckItemsize(running_itemsize, "running"));
    s->running_mean.assign(running_mean, running_mean + channels);
    s->running_var.assign(running_var, running_var + channels);
    s->tracked = *batches_tracked;
  }
  s->layer = bnps::c_abi::Str(layer);
  s->momentum = bnps::c_abi::Momentum(has_momentum, momentum);
  BNPS_RETURN_IF_ERROR(s->rule.CheckLayer(s->layer, s->tracks, s->momentum));
  s->exchange = s->rule.PlanForward(s->tracks).exchange;
  s->global_backward = s->exchange && s->rule.GlobalBackward();
  if (s->exchange) {
    absl::StatusOr<ClientRef> got =
        bnps::c_abi::ClientFor(c, "the policy exchanges BN statistics");
    BNPS_RETURN_IF_ERROR(got.status());
    s->client = *std::move(got);
  }
  s->channels = channels;
  s->eps = eps;
  s->itemsize = itemsize;
  s->running_itemsize = running_itemsize;
  s->running_mean_out = running_mean_out;
  s->running_var_out = running_var_out;
  s->tracked_out = batches_tracked_out;
  s->step = step;
  s->backward_step = backward_step;
  BNPS_RETURN_IF_ERROR(MakeBuffers(**q->device, *s));
  *out = new bnps_device_pass{q, std::move(s)};
  return 0;
}

void bnps_device_pass_free(bnps_device_pass* p) { delete p; }

void bnps_device_pass_steps(const bnps_device_pass* p, int64_t* steps) {
  steps[0] = p->state->step.load();
  steps[1] = p->state->backward_step.load();
}

int bnps_device_call_forward(bnps_device_call* a, char* err, size_t err_len) {
  int64_t info[3] = {0, 0, 0};
  const absl::Status s =
      QueueForward(a->pass, a->stream, a->count, a->mean, a->invstd,
                   a->count_out, info);
  a->exchanges = info[0];
  a->backward_exchanges = info[1];
  a->captured = info[2];
  return Fail(s, err, err_len);
}

int bnps_device_call_backward(const bnps_device_call* a, char* err,
                              size_t err_len) {
  return Fail(
      QueueBackward(a->pass, a->stream, a->invstd, a->sum_dy, a->sum_dy_xmu),
      err, err_len);
}

}  // extern "C"
