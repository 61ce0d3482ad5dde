// The C ABI's BN layer steps (python/native/bnps_c.h): the CPU kernels
// (bn/cpu_kernels.h) around the policy's worker side (client/worker_bn.h)
// and the client's exchanges, on the caller's memory. Translation and
// sequencing only: the rules are the client library's.

#include <omp.h>

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
#include "bn/cpu_kernels.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "bn/shape.h"
#include "client/worker_bn.h"
#include "python/native/bnps_c.h"
#include "python/native/bnps_c_internal.h"

namespace {

using bnps::c_abi::Fail;
using bnps::c_abi::Get;
using bnps::c_abi::Str;

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
  const bool tracks = running_mean != nullptr && running_var != nullptr;
  if (tracks && batches_tracked == nullptr) {
    BNPS_RETURN_IF_ERROR(absl::InvalidArgumentError(
        "running statistics without a count of the batches they tracked"));
  }
  std::optional<double> m;
  if (has_momentum) m = momentum;
  BNPS_RETURN_IF_ERROR(r->rule.CheckLayer(Str(layer), tracks, m));
  std::unique_ptr<bnps::bn::BnKernels> kernels = bnps::bn::NewCpuBnKernels();
  absl::StatusOr<bnps::bn::Moments> local = kernels->ComputeMoments(x, *shape);
  BNPS_RETURN_IF_ERROR(local.status());

  const bnps::client::BnForwardPlan plan = r->rule.PlanForward(tracks);
  std::optional<bnps::client::BnForwardResult> answer;
  if (plan.exchange) {
    if (c == nullptr) {
      BNPS_RETURN_IF_ERROR(absl::InvalidArgumentError(
          "the policy exchanges BN statistics and no client was given"));
    }
    auto client = Get(c);
    BNPS_RETURN_IF_ERROR(client.status());
    absl::StatusOr<bnps::client::BnForwardResult> a =
        (*client)->BnForward(Str(layer), step, *local, plan.want_running);
    BNPS_RETURN_IF_ERROR(a.status());
    info[1] = 1;
    answer = *std::move(a);
  }
  absl::StatusOr<bnps::client::BnForwardOutcome> out =
      r->rule.Resolve(*local, answer);
  BNPS_RETURN_IF_ERROR(out.status());
  if (tracks) {
    bnps::bn::RunningStats running{
        std::vector<double>(running_mean, running_mean + channels),
        std::vector<double>(running_var, running_var + channels)};
    BNPS_RETURN_IF_ERROR(
        bnps::client::ApplyRunning(*out, m, batches_tracked, &running));
    for (int64_t i = 0; i < channels; ++i) {
      running_mean[i] = static_cast<float>(running.mean[i]);
      running_var[i] = static_cast<float>(running.var[i]);
    }
  }

  const std::vector<double> var = bnps::bn::BiasedVariance(out->normalize);
  const std::vector<float> gamma = Vector(weight, channels, 1.0f);
  const std::vector<float> beta = Vector(bias, channels, 0.0f);
  const bnps::bn::Normalization norm{out->normalize.mean, var, gamma, beta,
                                     eps};
  BNPS_RETURN_IF_ERROR(kernels->Normalize(x, *shape, norm, y));
  std::copy(out->normalize.mean.begin(), out->normalize.mean.end(),
            out_stats);
  std::copy(var.begin(), var.end(), out_stats + channels);
  info[0] = out->normalize.count;
  info[2] = out->global_backward;
  return 0;
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
    auto client = c == nullptr
                      ? absl::StatusOr<std::shared_ptr<
                            bnps::client::GrpcPsClient>>(
                            absl::InvalidArgumentError(
                                "a backward exchange needs a client"))
                      : Get(c);
    BNPS_RETURN_IF_ERROR(client.status());
    absl::StatusOr<bnps::bn::BackwardSums> global =
        (*client)->BnBackward(Str(layer), step, *sums);
    BNPS_RETURN_IF_ERROR(global.status());
    sums = *std::move(global);
  }
  if (dx == nullptr) return 0;
  return Fail(kernels->BackwardInput(dy, x, *shape, norm, *sums, count, dx),
              err, err_len);
}

}  // extern "C"
