#include "server/bn_dispatch.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/codec.h"
#include "proto/limits.h"
#include "server/rpc_util.h"

namespace bnps::server {

using M = ServerMetrics;  // its enums; metrics_ may be null

namespace {

// The channels of a float64 tensor as it arrived (its bytes, not its
// claimed shape, which the decoder checks later).
int64_t Channels(const proto::Tensor& t) {
  return static_cast<int64_t>(t.data().size()) / 8;
}

}  // namespace

absl::Status CheckAnswerFits(int64_t bytes, int64_t cap,
                             const util::ByteBudget& budget) {
  if (bytes > cap) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the answer (about ", bytes, " bytes) is larger than the ", cap,
        " bytes a BN connection may leave unread (its cap)"));
  }
  if (bytes > budget.left()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the answer (about ", bytes, " bytes) does not fit the server's "
        "BN memory budget (", budget.left(), " of ", budget.limit(),
        " bytes left)"));
  }
  return absl::OkStatus();
}

BnDispatcher::BnDispatcher(Shard* shard, ServerMetrics* metrics,
                           int64_t generation, int caller, Admit admit)
    : shard_(shard),
      metrics_(metrics),
      generation_(generation),
      caller_(caller),
      admit_(std::move(admit)),
      layer_cache_(metrics, shard->memory_budget()) {}

int64_t BnDispatcher::AnswerBytes(int arrays, int64_t channels) {
  // Per array: the bytes, and its Tensor's dtype, shape and tags (< 64);
  // the response's id, code, contributors, a count and a status message
  // (< 1 KiB; long messages are cut in the log, not here, but an error
  // answer carries no arrays).
  return arrays * (8 * channels + 64) + 1024;
}

namespace {

// The answer to request `id` of `worker` for `layer`: the aggregator's
// reply `r` encoded, or its error; an answer too large for a message is
// replaced by that error.
proto::BnResponse EncodeAnswer(const Shard& shard, uint64_t id, int worker,
                               const std::string& layer, bool send_running,
                               const absl::StatusOr<BnAggregator::Reply>& r) {
  proto::BnResponse resp;
  resp.set_id(id);
  if (!r.ok()) {
    LogRejected(shard, "BnSync", worker, r.status());
    resp.set_code(static_cast<int>(r.status().code()));
    resp.set_message(std::string(r.status().message()));
    return resp;
  }
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
  // Sized before the work where the request says how large; should an
  // answer still not fit a message, the worker hears why.
  if (const size_t bytes = resp.ByteSizeLong();
      bytes > static_cast<size_t>(proto::kMaxMessageBytes)) {
    const absl::Status too_big = absl::ResourceExhaustedError(absl::StrCat(
        "the answer to this BN request (layer '", layer, "') took ", bytes,
        " bytes, more than a message may (", proto::kMaxMessageBytes, ")"));
    LogRejected(shard, "BnSync", worker, too_big);
    resp.Clear();
    resp.set_id(id);
    resp.set_code(static_cast<int>(too_big.code()));
    resp.set_message(std::string(too_big.message()));
  }
  return resp;
}

}  // namespace

void BnDispatcher::Dispatch(const proto::BnRequest& req, Send send) {
  const BnAggregator::Done reply = MakeReply(req, std::move(send));
  if (absl::Status s = AdmitRequest(req); !s.ok()) return reply(s);
  Route(req, reply);
}

BnAggregator::Done BnDispatcher::MakeReply(const proto::BnRequest& req,
                                           Send send) {
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
  return [this, id, worker, send_running, layer_metrics, arrived, phase, step,
          layer = req.layer(), send = std::move(send)](
             const absl::StatusOr<BnAggregator::Reply>& r) {
    if (layer_metrics != nullptr) {
      if (r.ok()) {
        const absl::Duration wait = absl::Now() - arrived;
        layer_metrics->Observe(static_cast<M::BnPhase>(phase), step, wait,
                               r->merge_time);
        metrics_->GroupWait(r->group, static_cast<M::BnPhase>(phase), wait);
        for (int64_t age : r->staleness) metrics_->Staleness(age);
      } else {
        metrics_->BnRejected(r.status().code());
      }
    }
    send(EncodeAnswer(*shard_, id, worker, layer, send_running, r));
  };
}

absl::Status BnDispatcher::AdmitAnswer(const proto::BnRequest& req, int arrays,
                                       int64_t channels) const {
  const int64_t bytes = AnswerBytes(arrays, channels);
  if (bytes > proto::kMaxMessageBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the answer to this BN request (layer '", req.layer(), "', ",
        channels, " channels", req.want_running() ? ", want_running" : "",
        ") would take about ", bytes, " bytes, more than a message may (",
        proto::kMaxMessageBytes, ")",
        req.want_running() ? "; read the running stats with BN_RUNNING" : ""));
  }
  return admit_ ? admit_(bytes) : absl::OkStatus();
}

absl::Status BnDispatcher::AdmitRequest(const proto::BnRequest& req) {
  // BN_RUNNING only reads; the rest take part, of the job's generation.
  const bool takes_part = req.phase() != proto::BN_RUNNING;
  AdmissionRequest a;
  a.caller = caller_;
  a.job = req.job();
  a.worker = req.worker();
  a.registered = takes_part;
  a.keys = absl::MakeConstSpan(&req.layer(), 1);
  if (takes_part) a.generation = generation_;
  const absl::StatusOr<Admission> admitted = shard_->Admit(a);
  if (!admitted.ok()) return admitted.status();
  switch (req.phase()) {
    case proto::BN_FORWARD:
      return AdmitAnswer(req, req.want_running() ? 4 : 2,
                         Channels(req.moments().mean()));
    case proto::BN_BACKWARD:
      return AdmitAnswer(req, 2, Channels(req.sums().sum_dy()));
    case proto::BN_LOCAL_RUNNING:
      return AdmitAnswer(req, 2, Channels(req.running().mean()));
    default:  // small answers, or sized in Route (BN_RUNNING)
      return absl::OkStatus();
  }
}

void BnDispatcher::Route(const proto::BnRequest& req,
                         const BnAggregator::Done& reply) {
  const int worker = req.worker();
  BnAggregator& bn = shard_->bn();
  const absl::Time deadline = shard_->Deadline();
  switch (req.phase()) {
    case proto::BN_FORWARD:
    case proto::BN_RECAL: {
      absl::StatusOr<bn::Moments> m = proto::DecodeMoments(req.moments());
      if (!m.ok()) return reply(m.status());
      if (req.phase() == proto::BN_FORWARD) {
        return bn.Forward(worker, req.step(), req.layer(), *std::move(m),
                          deadline, reply);
      }
      return bn.Recal(worker, req.step(), req.layer(), *std::move(m), reply);
    }
    case proto::BN_BACKWARD: {
      absl::StatusOr<bn::BackwardSums> sums = proto::DecodeSums(req.sums());
      if (!sums.ok()) return reply(sums.status());
      return bn.Backward(worker, req.step(), req.layer(), *std::move(sums),
                         deadline, reply);
    }
    case proto::BN_RECAL_FINISH:
      return bn.RecalFinish(worker, req.layer(), deadline, reply);
    case proto::BN_LOCAL_RUNNING: {
      absl::StatusOr<bn::RunningStats> r = proto::DecodeRunning(req.running());
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
      if (absl::Status a = AdmitAnswer(
              req, 2, static_cast<int64_t>(out.running->mean.size()));
          !a.ok()) {
        return reply(a);
      }
      return reply(std::move(out));
    }
    default:
      return reply(absl::InvalidArgumentError(
          absl::StrCat("unknown BN phase ", static_cast<int>(req.phase()))));
  }
}

}  // namespace bnps::server
