// The C ABI's stream-ordered exchanges (python/native/bnps_c.h,
// bnps_stream_queue_*): the exchange-alone layer calls as jobs of a
// client::StreamExchanges. Translation and sequencing only.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bn/moments.h"
#include "client/stream_exchanges.h"
#include "client/worker_bn.h"
#include "python/native/bnps_c.h"
#include "python/native/bnps_c_exchange.h"
#include "python/native/bnps_c_internal.h"

struct bnps_stream_queue {
  explicit bnps_stream_queue(
      std::unique_ptr<bnps::client::HostFuncLauncher> launcher)
      : exchanges(std::move(launcher)) {}
  bnps::client::StreamExchanges exchanges;
};

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

// The running rows of a forward job's `out` (after the statistics):
// running_mean, running_var and the count of batches, or zeros.
void WriteRunning(const double* running_mean, const double* running_var,
                  const int64_t* batches_tracked, int64_t channels,
                  double* out) {
  double* rows = out + 2 * channels;
  if (running_mean == nullptr || running_var == nullptr) {
    std::fill(rows, rows + 2 * channels + 1, 0.0);
    return;
  }
  std::copy(running_mean, running_mean + channels, rows);
  std::copy(running_var, running_var + channels, rows + channels);
  rows[2 * channels] = static_cast<double>(*batches_tracked);
}

}  // namespace

extern "C" {

int bnps_stream_queue_new(int on_cuda, bnps_stream_queue** out, char* err,
                          size_t err_len) {
  *out = nullptr;
  std::unique_ptr<bnps::client::HostFuncLauncher> launcher;
  if (on_cuda) {
    auto cuda = bnps::client::NewCudaHostFuncLauncher();
    BNPS_RETURN_IF_ERROR(cuda.status());
    launcher = *std::move(cuda);
  } else {
    launcher = bnps::client::NewInlineLauncher();
  }
  *out = new bnps_stream_queue(std::move(launcher));
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

int bnps_stream_queue_forward(
    bnps_stream_queue* q, void* stream, const bnps_worker_bn* r,
    bnps_client* c, const char* layer, int64_t step, int64_t count,
    const double* local, int64_t channels, int has_momentum, double momentum,
    double* running_mean, double* running_var, int64_t* batches_tracked,
    double* out, int64_t* info, bnps_outcome** outcome, char* err,
    size_t err_len) {
  info[0] = info[1] = 0;
  *outcome = nullptr;
  BNPS_RETURN_IF_ERROR(bnps::c_abi::CheckChannels(channels));
  const bool tracks = running_mean != nullptr && running_var != nullptr;
  if (tracks && batches_tracked == nullptr) {
    BNPS_RETURN_IF_ERROR(absl::InvalidArgumentError(
        "running statistics without a count of the batches they tracked"));
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
  auto result = std::make_shared<Outcome>();
  bnps::client::StreamExchanges::Job job;
  job.exchange = [=, name = Str(layer)]() -> absl::Status {
    bnps::bn::Moments moments{count, std::vector<double>(local, local + channels),
                              std::vector<double>(channels)};
    for (int64_t i = 0; i < channels; ++i) {
      moments.m2[i] = local[channels + i] * static_cast<double>(count);
    }
    if (absl::Status s = bnps::bn::ValidateMoments(moments); !s.ok()) return s;
    int64_t unused_info[3] = {0, 0, 0};
    absl::StatusOr<bnps::client::BnForwardOutcome> o =
        bnps::c_abi::ExchangeForward(
            rule, [&client] { return absl::StatusOr<ClientRef>(client); },
            name, step, moments, m, running_mean, running_var,
            batches_tracked, unused_info);
    if (!o.ok()) return o.status();
    bnps::c_abi::WriteStats(o->normalize, out);
    WriteRunning(running_mean, running_var, batches_tracked, channels, out);
    result->count = o->normalize.count;
    result->stats.assign(out, out + 2 * channels);
    return absl::OkStatus();
  };
  job.fallback = [=]() {
    std::copy(local, local + 2 * channels, out);
    WriteRunning(running_mean, running_var, batches_tracked, channels, out);
    result->count = count;
    result->stats.assign(local, local + 2 * channels);
  };
  BNPS_RETURN_IF_ERROR(q->exchanges.Enqueue(stream, std::move(job)));
  info[0] = plan.exchange;
  info[1] = plan.exchange && rule.GlobalBackward();
  *outcome = new bnps_outcome{std::move(result)};
  return 0;
}

int bnps_stream_queue_backward(bnps_stream_queue* q, void* stream,
                               bnps_client* c, const char* layer, int64_t step,
                               const double* in, int has_weight,
                               int64_t channels, const bnps_outcome* outcome,
                               double eps, double* k, char* err,
                               size_t err_len) {
  BNPS_RETURN_IF_ERROR(bnps::c_abi::CheckChannels(channels));
  const std::string name = Str(layer);
  if (name.empty() && k == nullptr) return 0;
  if (k != nullptr && outcome == nullptr) {
    BNPS_RETURN_IF_ERROR(absl::InvalidArgumentError(
        "dx's map needs the forward's outcome"));
  }
  ClientRef client;
  if (!name.empty()) {
    absl::StatusOr<ClientRef> got = ClientFor(c, "a backward exchange");
    BNPS_RETURN_IF_ERROR(got.status());
    client = *std::move(got);
  }
  std::shared_ptr<const Outcome> forward =
      outcome == nullptr ? nullptr : outcome->outcome;
  const double* weight = has_weight ? in + 2 * channels : nullptr;
  auto local_sums = [in, channels]() {
    return bnps::bn::BackwardSums{
        std::vector<double>(in, in + channels),
        std::vector<double>(in + channels, in + 2 * channels)};
  };
  auto write_k = [=](const bnps::bn::BackwardSums& sums) {
    return bnps::c_abi::WriteInputGradient(forward->stats.data(), weight,
                                           channels, eps, sums, forward->count,
                                           k);
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
    if (k == nullptr) return;
    if (!write_k(local_sums()).ok()) std::fill(k, k + 3 * channels, 0.0);
  };
  return Fail(q->exchanges.Enqueue(stream, std::move(job)), err, err_len);
}

void bnps_outcome_free(bnps_outcome* o) { delete o; }

}  // extern "C"
