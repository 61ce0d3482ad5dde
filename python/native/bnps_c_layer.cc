// The C ABI's BN layer steps (python/native/bnps_c.h): the CPU kernels
// (bn/cpu_kernels.h) around the policy's worker side (client/worker_bn.h)
// and the client's exchanges, on the caller's memory. Translation and
// sequencing only: the rules are the client library's.

#include <omp.h>

#include <cstdint>
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "bn/cpu_kernels.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "bn/shape.h"
#include "client/worker_bn.h"
#include "python/native/bnps_c.h"
#include "python/native/bnps_c_exchange.h"
#include "python/native/bnps_c_internal.h"

namespace {

using bnps::c_abi::BackwardExchange;
using bnps::c_abi::CheckChannels;
using bnps::c_abi::ClientFor;
using bnps::c_abi::ClientRef;
using bnps::c_abi::Fail;
using bnps::c_abi::Momentum;
using bnps::c_abi::Str;
using bnps::c_abi::WriteInputGradient;
using bnps::c_abi::WriteStats;

// ExchangeForward with the client of `c`.
template <typename T>
absl::StatusOr<bnps::client::BnForwardOutcome> Forward(
    const bnps_worker_bn* r, bnps_client* c, const char* layer, int64_t step,
    const bnps::bn::Moments& local, int has_momentum, double momentum,
    T* running_mean, T* running_var, int64_t* batches_tracked, int64_t* info) {
  return bnps::c_abi::ExchangeForward(
      r->rule,
      [c] {
        return ClientFor(
            c, "the policy exchanges BN statistics");
      },
      Str(layer), step, local, Momentum(has_momentum, momentum), running_mean,
      running_var, batches_tracked, info);
}

// The backward exchange of `layer` at `step` through `c`.
absl::Status Backward(bnps_client* c, const char* layer, int64_t step,
                      bnps::bn::BackwardSums* sums) {
  absl::StatusOr<ClientRef> client = ClientFor(c, "a backward exchange");
  if (!client.ok()) return client.status();
  return BackwardExchange(**client, Str(layer), step, sums);
}

absl::StatusOr<bnps::bn::Shape> LayerShape(int64_t n, int64_t channels,
                                           int64_t spatial) {
  if (n < 0 || channels < 1 || spatial < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tensor of ", n, " x ", channels, " x ", spatial,
                     " values: n >= 0, channels >= 1, spatial >= 1"));
  }
  bnps::bn::Shape shape;
  shape.n = n;
  shape.c = channels;
  shape.h = spatial;
  return shape;
}

void SetThreads(int num_threads) {
  if (num_threads > 0) omp_set_num_threads(num_threads);
}

// `p` (`channels` values), or `fill` when p is null.
std::vector<float> Vector(const float* p, int64_t channels, float fill) {
  return p == nullptr ? std::vector<float>(channels, fill)
                      : std::vector<float>(p, p + channels);
}

}  // namespace

extern "C" {

int bnps_layer_forward(const bnps_worker_bn* r, bnps_client* c,
                       const char* layer, int64_t step, const float* x,
                       int64_t n, int64_t channels, int64_t spatial,
                       const float* weight, const float* bias, double eps,
                       int has_momentum, double momentum, float* running_mean,
                       float* running_var, int64_t* batches_tracked,
                       int num_threads, float* y, double* out_stats,
                       int64_t* info, char* err, size_t err_len) {
  info[0] = info[1] = info[2] = 0;
  absl::StatusOr<bnps::bn::Shape> shape = LayerShape(n, channels, spatial);
  BNPS_RETURN_IF_ERROR(shape.status());
  SetThreads(num_threads);
  std::unique_ptr<bnps::bn::BnKernels> kernels = bnps::bn::NewCpuBnKernels();
  absl::StatusOr<bnps::bn::Moments> local = kernels->ComputeMoments(x, *shape);
  BNPS_RETURN_IF_ERROR(local.status());
  absl::StatusOr<bnps::client::BnForwardOutcome> out =
      Forward(r, c, layer, step, *local, has_momentum, momentum,
                      running_mean, running_var, batches_tracked, info);
  BNPS_RETURN_IF_ERROR(out.status());
  const std::vector<double> var = WriteStats(out->normalize, out_stats);
  const std::vector<float> gamma = Vector(weight, channels, 1.0f);
  const std::vector<float> beta = Vector(bias, channels, 0.0f);
  const bnps::bn::Normalization norm{out->normalize.mean, var, gamma, beta,
                                     eps};
  return Fail(kernels->Normalize(x, *shape, norm, y), err, err_len);
}

int bnps_layer_exchange_forward(const bnps_worker_bn* r, bnps_client* c,
                                const char* layer, int64_t step,
                                int64_t count, const double* mean,
                                const double* m2, int64_t channels,
                                int has_momentum, double momentum,
                                double* running_mean, double* running_var,
                                int64_t* batches_tracked, double* out_stats,
                                int64_t* info, char* err, size_t err_len) {
  info[0] = info[1] = info[2] = 0;
  BNPS_RETURN_IF_ERROR(CheckChannels(channels));
  bnps::bn::Moments local{count, std::vector<double>(mean, mean + channels),
                          std::vector<double>(m2, m2 + channels)};
  BNPS_RETURN_IF_ERROR(bnps::bn::ValidateMoments(local));
  absl::StatusOr<bnps::client::BnForwardOutcome> out =
      Forward(r, c, layer, step, local, has_momentum, momentum,
                      running_mean, running_var, batches_tracked, info);
  BNPS_RETURN_IF_ERROR(out.status());
  WriteStats(out->normalize, out_stats);
  return 0;
}

int bnps_layer_exchange_backward(bnps_client* c, const char* layer,
                                 int64_t step, const double* sum_dy,
                                 const double* sum_dy_xhat, int64_t channels,
                                 int64_t count, const double* stats,
                                 const double* weight, double eps, double* k,
                                 char* err, size_t err_len) {
  BNPS_RETURN_IF_ERROR(CheckChannels(channels));
  bnps::bn::BackwardSums sums{
      std::vector<double>(sum_dy, sum_dy + channels),
      std::vector<double>(sum_dy_xhat, sum_dy_xhat + channels)};
  if (!Str(layer).empty()) {
    BNPS_RETURN_IF_ERROR(Backward(c, layer, step, &sums));
  }
  if (k == nullptr) return 0;
  return Fail(
      WriteInputGradient(stats, weight, channels, eps, sums, count, k), err,
      err_len);
}

int bnps_layer_backward(bnps_client* c, const char* layer, int64_t step,
                        const float* dy, const float* x, int64_t n,
                        int64_t channels, int64_t spatial, const float* weight,
                        int64_t count, const double* stats, double eps,
                        int num_threads, float* dx, float* dweight,
                        float* dbias, char* err, size_t err_len) {
  absl::StatusOr<bnps::bn::Shape> shape = LayerShape(n, channels, spatial);
  BNPS_RETURN_IF_ERROR(shape.status());
  SetThreads(num_threads);
  const std::vector<float> gamma = Vector(weight, channels, 1.0f);
  const bnps::bn::Normalization norm{
      absl::MakeConstSpan(stats, channels),
      absl::MakeConstSpan(stats + channels, channels), gamma, {}, eps};
  std::unique_ptr<bnps::bn::BnKernels> kernels = bnps::bn::NewCpuBnKernels();
  absl::StatusOr<bnps::bn::BackwardSums> sums =
      kernels->BackwardReduce(dy, x, *shape, norm);
  BNPS_RETURN_IF_ERROR(sums.status());
  for (int64_t i = 0; i < channels; ++i) {
    if (dweight != nullptr) dweight[i] = static_cast<float>(sums->sum_dy_xhat[i]);
    if (dbias != nullptr) dbias[i] = static_cast<float>(sums->sum_dy[i]);
  }
  if (!Str(layer).empty()) {
    BNPS_RETURN_IF_ERROR(Backward(c, layer, step, &*sums));
  }
  if (dx == nullptr) return 0;
  return Fail(kernels->BackwardInput(dy, x, *shape, norm, *sums, count, dx),
              err, err_len);
}

int bnps_layer_pass_forward(bnps_layer_pass* p, char* err, size_t err_len) {
  return bnps_layer_forward(
      p->rule, p->client, p->layer, p->step, p->x, p->n, p->channels,
      p->spatial, p->weight, p->bias, p->eps,
      static_cast<int>(p->has_momentum), p->momentum, p->running_mean,
      p->running_var, p->batches_tracked, static_cast<int>(p->num_threads),
      p->y, p->stats, p->info, err, err_len);
}

int bnps_layer_pass_backward(const bnps_layer_pass* p, char* err,
                             size_t err_len) {
  return bnps_layer_backward(p->client, p->layer, p->step, p->dy, p->x, p->n,
                             p->channels, p->spatial, p->weight, p->count,
                             p->stats, p->eps,
                             static_cast<int>(p->num_threads), p->dx,
                             p->dweight, p->dbias, err, err_len);
}

}  // extern "C"
