// The worker side of a BN layer's exchanges on host values, shared by the C
// ABI's layer steps (bnps_c_layer.cc) and its stream-ordered exchanges
// (bnps_c_queue.cc). Sequencing only: the rules are client/worker_bn.h's.
// Not part of the ABI.

#ifndef BNPS_PYTHON_NATIVE_BNPS_C_EXCHANGE_H_
#define BNPS_PYTHON_NATIVE_BNPS_C_EXCHANGE_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "client/grpc_ps_client.h"
#include "client/worker_bn.h"
#include "python/native/bnps_c_internal.h"

namespace bnps::c_abi {

using ClientRef = std::shared_ptr<bnps::client::GrpcPsClient>;

// The connection of `c` for an exchange: INVALID_ARGUMENT when there is
// none, FAILED_PRECONDITION once closed.
inline absl::StatusOr<ClientRef> ClientFor(bnps_client* c, const char* what) {
  if (c == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " and no client was given"));
  }
  return Get(c);
}

// WorkerBn::Forward on host values: the client from get_client() (a
// StatusOr<ClientRef>, called only when the plan exchanges), the running
// statistics from running_mean and running_var (float or double, `channels`
// each, updated in place on success; null: the layer tracks none) with
// *batches_tracked. info[1] is set once BnForward succeeded (the step is
// used even if a later part fails), info[0] and info[2] on success: the
// count and whether the backward pass exchanges.
template <typename T, typename GetClient>
absl::StatusOr<bnps::client::BnForwardOutcome> ExchangeForward(
    const bnps::client::WorkerBn& rule, GetClient get_client,
    const std::string& layer, int64_t step, const bnps::bn::Moments& local,
    std::optional<double> momentum, T* running_mean, T* running_var,
    int64_t* batches_tracked, int64_t* info) {
  const int64_t channels = local.channels();
  std::optional<bnps::bn::RunningStats> held;
  std::optional<bnps::client::LayerRunning> running;
  if (running_mean != nullptr && running_var != nullptr) {
    held = bnps::bn::RunningStats{
        std::vector<double>(running_mean, running_mean + channels),
        std::vector<double>(running_var, running_var + channels)};
    running = bnps::client::LayerRunning{momentum, batches_tracked, &*held};
  }
  ClientRef client;  // kept for the call
  auto get = [&]() -> absl::StatusOr<bnps::client::PsClient*> {
    absl::StatusOr<ClientRef> c = get_client();
    if (!c.ok()) return c.status();
    client = *std::move(c);
    return client.get();
  };
  bool exchanged = false;
  absl::StatusOr<bnps::client::BnForwardOutcome> out =
      rule.Forward(get, layer, step, local, running, &exchanged);
  if (exchanged) info[1] = 1;
  if (!out.ok()) return out.status();
  if (held.has_value()) {
    for (int64_t i = 0; i < channels; ++i) {
      running_mean[i] = static_cast<T>(held->mean[i]);
      running_var[i] = static_cast<T>(held->var[i]);
    }
  }
  info[0] = out->normalize.count;
  info[2] = out->global_backward;
  return out;
}

// The per-channel arrays of the exchange-alone calls hold `channels` values.
inline absl::Status CheckChannels(int64_t channels) {
  if (channels >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(channels, " channels: want >= 1"));
}

// *sums replaced by their sums over the workers (BnBackward of `layer` at
// `step` through `client`).
inline absl::Status BackwardExchange(bnps::client::GrpcPsClient& client,
                                     const std::string& layer, int64_t step,
                                     bnps::bn::BackwardSums* sums) {
  absl::StatusOr<bnps::bn::BackwardSums> global =
      client.BnBackward(layer, step, *sums);
  if (!global.ok()) return global.status();
  *sums = *std::move(global);
  return absl::OkStatus();
}

// The mean and the biased variance of `normalize` into `out` (2 x channels);
// returns the variance.
inline std::vector<double> WriteStats(const bnps::bn::Moments& normalize,
                                      double* out) {
  std::vector<double> var = bnps::bn::BiasedVariance(normalize);
  std::copy(normalize.mean.begin(), normalize.mean.end(), out);
  std::copy(var.begin(), var.end(), out + normalize.mean.size());
  return var;
}

// dx = k1 dy + k2 x + k3 (bn::InputGradient) into k (3 x channels) for a
// forward that normalized with `stats` (2 x channels: the mean, the biased
// variance) over `count` samples per channel, with `weight` (null: ones).
inline absl::Status WriteInputGradient(const double* stats,
                                       const double* weight, int64_t channels,
                                       double eps,
                                       const bnps::bn::BackwardSums& sums,
                                       int64_t count, double* k) {
  absl::StatusOr<bnps::bn::InputGradientMap> map = bnps::bn::InputGradient(
      absl::MakeConstSpan(stats, channels),
      absl::MakeConstSpan(stats + channels, channels),
      weight == nullptr ? absl::Span<const double>()
                        : absl::MakeConstSpan(weight, channels),
      eps, sums, count);
  if (!map.ok()) return map.status();
  std::copy(map->k1.begin(), map->k1.end(), k);
  std::copy(map->k2.begin(), map->k2.end(), k + channels);
  std::copy(map->k3.begin(), map->k3.end(), k + 2 * channels);
  return absl::OkStatus();
}

inline std::optional<double> Momentum(int has_momentum, double momentum) {
  if (has_momentum) return momentum;
  return std::nullopt;
}

}  // namespace bnps::c_abi

#endif  // BNPS_PYTHON_NATIVE_BNPS_C_EXCHANGE_H_
