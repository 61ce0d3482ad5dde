// BnCalls' typed calls: each builds its request, sends it through BnCall
// (bn_stream.cc: the streams) and checks the answer before it decodes it.

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/internal/bn_stream.h"
#include "proto/codec.h"
#include "proto/sharding.h"

namespace bnps::client::internal {
namespace {

// The head of a BN request; BnCall adds the job, the worker and the id.
proto::BnRequest BnHead(const std::string& layer, proto::BnPhase phase,
                        int64_t step = 0) {
  proto::BnRequest head;
  head.set_layer(layer);
  head.set_phase(phase);
  head.set_step(step);
  return head;
}

absl::Status CheckChannels(int64_t got, int64_t want, absl::string_view what) {
  if (got == 0 || got != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " have ", got, " and ", want,
                     " channels; need the same non-zero ", "number"));
  }
  return absl::OkStatus();
}

absl::Status CheckSums(const bn::BackwardSums& s) {
  return CheckChannels(s.sum_dy.size(), s.sum_dy_xhat.size(),
                       "local backward sums: sum_dy and sum_dy_xhat");
}

absl::Status CheckRunning(const bn::RunningStats& r) {
  return CheckChannels(r.mean.size(), r.var.size(),
                       "running stats: mean and var");
}

}  // namespace

absl::Status BnCalls::MalformedBn(const std::string& layer,
                                 const absl::Status& s) const {
  return Malformed(channels_->ShardName(proto::ShardForKey(layer, channels_->num_shards())), s);
}

absl::StatusOr<BnForwardResult> BnCalls::BnForward(const std::string& layer,
                                                    int64_t step,
                                                    const bn::Moments& local,
                                                    bool want_running) {
  if (absl::Status s = bn::ValidateMoments(local); !s.ok()) return s;
  proto::BnRequest request = BnHead(layer, proto::BN_FORWARD, step);
  request.set_want_running(want_running);
  proto::EncodeMoments(local, request.mutable_moments());
  absl::StatusOr<proto::BnResponse> answer = BnCall(std::move(request));
  if (!answer.ok()) return answer.status();
  BnForwardResult result;
  absl::StatusOr<bn::Moments> merged =
      proto::DecodeMoments(answer->moments(), local.channels());
  if (!merged.ok()) return MalformedBn(layer, merged.status());
  result.merged = *std::move(merged);
  if (want_running) {
    absl::StatusOr<bn::RunningStats> running =
        proto::DecodeRunning(answer->running(), local.channels());
    if (!running.ok()) return MalformedBn(layer, running.status());
    result.running = *std::move(running);
  }
  result.contributors = answer->contributors();
  return result;
}

absl::StatusOr<bn::BackwardSums> BnCalls::BnBackward(
    const std::string& layer, int64_t step, const bn::BackwardSums& local) {
  if (absl::Status s = CheckSums(local); !s.ok()) return s;
  proto::BnRequest request = BnHead(layer, proto::BN_BACKWARD, step);
  proto::EncodeSums(local, request.mutable_sums());
  absl::StatusOr<proto::BnResponse> answer = BnCall(std::move(request));
  if (!answer.ok()) return answer.status();
  absl::StatusOr<bn::BackwardSums> sums =
      proto::DecodeSums(answer->sums(), local.sum_dy.size());
  if (!sums.ok()) return MalformedBn(layer, sums.status());
  return sums;
}

absl::Status BnCalls::BnRecal(const std::string& layer, int64_t batch,
                               const bn::Moments& moments) {
  if (absl::Status s = bn::ValidateMoments(moments); !s.ok()) return s;
  proto::BnRequest request = BnHead(layer, proto::BN_RECAL, batch);
  proto::EncodeMoments(moments, request.mutable_moments());
  return BnCall(std::move(request)).status();
}

absl::StatusOr<bn::RunningStats> BnCalls::BnRecalFinish(
    const std::string& layer) {
  return BnCallForRunning(BnHead(layer, proto::BN_RECAL_FINISH), -1);
}

absl::StatusOr<bn::RunningStats> BnCalls::BnLocalRunning(
    const std::string& layer, const bn::RunningStats& running) {
  if (absl::Status s = CheckRunning(running); !s.ok()) return s;
  proto::BnRequest request = BnHead(layer, proto::BN_LOCAL_RUNNING);
  proto::EncodeRunning(running, request.mutable_running());
  return BnCallForRunning(std::move(request), running.mean.size());
}

absl::StatusOr<bn::RunningStats> BnCalls::BnRunning(const std::string& layer,
                                                     int64_t channels) {
  if (channels <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BnRunning: ", channels, " channels"));
  }
  return BnCallForRunning(BnHead(layer, proto::BN_RUNNING), channels);
}

absl::StatusOr<bn::RunningStats> BnCalls::BnCallForRunning(
    proto::BnRequest request, int64_t channels) {
  const std::string layer = request.layer();
  absl::StatusOr<proto::BnResponse> answer = BnCall(std::move(request));
  if (!answer.ok()) return answer.status();
  absl::StatusOr<bn::RunningStats> running =
      proto::DecodeRunning(answer->running(), channels);
  if (!running.ok()) return MalformedBn(layer, running.status());
  return running;
}

}  // namespace bnps::client::internal
