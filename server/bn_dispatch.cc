#include "server/bn_dispatch.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/codec.h"
#include "server/rpc_util.h"

namespace bnps::server {

using M = ServerMetrics;  // its enums; metrics_ may be null

BnDispatcher::BnDispatcher(Shard* shard, ServerMetrics* metrics,
                           int64_t generation)
    : shard_(shard),
      metrics_(metrics),
      generation_(generation),
      layer_cache_(metrics) {}

void BnDispatcher::Dispatch(const proto::BnRequest& req, Send send) {
  const uint64_t id = req.id();
  const int worker = req.worker();
  // A forward answer carries the running stats only on request (they
  // double its size).
  const bool send_running =
      req.phase() != proto::BN_FORWARD || req.want_running();
  // Metrics: the layer's series (resolved once per stream and layer) and
  // the arrival time, for the wait.
  ServerMetrics::Layer* layer_metrics = nullptr;
  absl::Time arrived;
  const int phase = req.phase() - proto::BN_FORWARD;  // as M::BnPhase
  const int64_t step = req.step();
  if (metrics_ && phase >= 0 && phase < M::kNumBnPhases) {
    arrived = absl::Now();
    layer_metrics = layer_cache_.Get(req.layer());
    if (req.phase() == proto::BN_FORWARD || req.phase() == proto::BN_BACKWARD) {
      metrics_->WorkerAt(worker, step);
    }
  }
  auto reply = [this, id, worker, send_running, layer_metrics, arrived, phase,
                step, send = std::move(send)](
                   const absl::StatusOr<BnAggregator::Reply>& r) {
    if (layer_metrics != nullptr) {
      if (r.ok()) {
        layer_metrics->Observe(static_cast<M::BnPhase>(phase), step,
                               absl::Now() - arrived, r->merge_time);
        for (int64_t age : r->staleness) metrics_->Staleness(age);
      } else {
        metrics_->BnRejected(r.status().code());
      }
    }
    proto::BnResponse resp;
    resp.set_id(id);
    if (!r.ok()) {
      LogRejected(*shard_, "BnSync", worker, r.status());
      resp.set_code(static_cast<int>(r.status().code()));
      resp.set_message(std::string(r.status().message()));
    } else {
      resp.set_contributors(r->contributors);
      if (!r->moments.mean.empty()) {
        proto::EncodeMoments(r->moments, resp.mutable_moments());
      }
      if (!r->sums.sum_dy.empty()) {
        proto::EncodeSums(r->sums, resp.mutable_sums());
      }
      if (send_running && r->running.has_value()) {
        proto::EncodeRunning(*r->running, resp.mutable_running());
      }
    }
    send(resp);
  };
  absl::Status s = shard_->CheckCaller(req.job(), worker);
  if (s.ok()) s = shard_->CheckOwned(req.layer());
  // BN_RUNNING only reads; the rest must be of the job's generation.
  Shard::GenerationGuard guard(shard_, generation_);
  if (s.ok() && req.phase() != proto::BN_RUNNING) s = guard.status();
  if (!s.ok()) {
    reply(s);
    return;
  }
  BnAggregator& bn = shard_->bn();
  const absl::Time deadline = shard_->Deadline();
  switch (req.phase()) {
    case proto::BN_FORWARD:
    case proto::BN_RECAL: {
      absl::StatusOr<bn::Moments> m =
          proto::DecodeMoments(req.moments());
      if (!m.ok()) return reply(m.status());
      if (req.phase() == proto::BN_FORWARD) {
        return bn.Forward(worker, req.step(), req.layer(), *std::move(m),
                          deadline, reply);
      }
      return bn.Recal(worker, req.step(), req.layer(), *std::move(m), reply);
    }
    case proto::BN_BACKWARD: {
      absl::StatusOr<bn::BackwardSums> sums =
          proto::DecodeSums(req.sums());
      if (!sums.ok()) return reply(sums.status());
      return bn.Backward(worker, req.step(), req.layer(), *std::move(sums),
                         deadline, reply);
    }
    case proto::BN_RECAL_FINISH:
      return bn.RecalFinish(worker, req.layer(), deadline, reply);
    case proto::BN_LOCAL_RUNNING: {
      absl::StatusOr<bn::RunningStats> r =
          proto::DecodeRunning(req.running());
      if (!r.ok()) return reply(r.status());
      return bn.LocalRunning(worker, req.layer(), *std::move(r), deadline, reply);
    }
    case proto::BN_RUNNING: {
      BnAggregator::Reply out;
      out.running = bn.Running(req.layer());
      if (!out.running.has_value()) {
        return reply(absl::NotFoundError(absl::StrCat(
            "layer '", req.layer(), "' has no running stats on shard ",
            shard_->options().shard, " yet")));
      }
      return reply(std::move(out));
    }
    default:
      return reply(absl::InvalidArgumentError(
          absl::StrCat("unknown BN phase ", static_cast<int>(req.phase()))));
  }
}

}  // namespace bnps::server
