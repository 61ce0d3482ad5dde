#include "server/shard_service.h"

#include <algorithm>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "proto/codec.h"
#include "security/job_token.h"
#include "server/checkpoint.h"
#include "proto/limits.h"
#include "proto/tensor_wire.h"
#include "server/rpc_util.h"

namespace bnps::server {
namespace {

using M = ServerMetrics;  // its enums; metrics_ may be null everywhere

// Gradients of one step arrive as chunks (framed by proto/tensor_wire); each
// tensor is read straight into a staging buffer and pushed once complete.
class PushReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  PushReactor(Shard* shard, ScratchPool* scratch, grpc::ByteBuffer* resp,
              ServerMetrics* metrics, int64_t generation)
      : shard_(shard),
        generation_(generation),
        scratch_(scratch),
        metrics_(metrics),
        resp_(resp),
        reader_(
            [this](const std::string& key, absl::Span<const int64_t> shape,
                   int64_t n) -> absl::StatusOr<float*> {
              if (absl::Status s = shard_->CheckOwned(key); !s.ok()) return s;
              // n is what the sender declared: only once the store knows the
              // key with this very shape (so n is its size) and would take
              // the push is room reserved for it.
              if (absl::Status s =
                      shard_->store().CheckPush(worker_, step_, key, shape);
                  !s.ok()) {
                return s;
              }
              if (staging_.capacity() < static_cast<size_t>(n)) {
                staging_ = ScratchPool::Buffer();  // back before taking
                staging_ = scratch_->Take(n);
              }
              staged_ = n;
              return staging_.data();
            },
            [this](const std::string& key) { return PushTensor(key); }) {
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client finished sending
      absl::Status s;
      if (reader_.pending()) {
        s = absl::InvalidArgumentError("push ended inside a chunked tensor");
      } else if (!started_) {
        s = absl::InvalidArgumentError("empty push");
      }
      Done(s);
      return;
    }
    if (absl::Status s = Handle(); !s.ok()) {
      Done(s);
      return;
    }
    StartRead(&message_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Handle() {
    if (metrics_) metrics_->Received(M::kPushGradients, message_.Length());
    proto::PushGradientsRequest head;
    // The head is checked before any chunk of the message is read.
    absl::Status s = reader_.Read(message_, kChunksField, &head,
                                  [&]() { return CheckHead(head); });
    message_.Clear();
    return s;
  }

  absl::Status CheckHead(const proto::PushGradientsRequest& head) {
    if (!started_) {
      if (absl::Status s = shard_->CheckCaller(head.job(), head.worker());
          !s.ok()) {
        return s;
      }
      started_ = true;
      worker_ = head.worker();
      step_ = head.step();
      samples_ = head.num_samples();
      if (metrics_) metrics_->WorkerAt(worker_, step_);
    } else if (head.worker() != worker_ || head.step() != step_ ||
               head.num_samples() != samples_) {
      return absl::InvalidArgumentError(
          "worker, step and num_samples must not change within one push");
    }
    return absl::OkStatus();
  }

  absl::Status PushTensor(const std::string& key) {
    Shard::GenerationGuard guard(shard_, generation_);
    if (!guard.status().ok()) return guard.status();
    absl::StatusOr<ParameterStore::PushResult> r = shard_->store().Push(
        worker_, step_, key, reader_.shape(),
        absl::MakeConstSpan(staging_.data(), staged_), samples_);
    if (!r.ok()) return r.status();
    if (r->duplicate) {
      response_.set_duplicates(response_.duplicates() + 1);
      if (metrics_) metrics_->PushDuplicate();
    } else {
      response_.set_applied(response_.applied() + 1);
      if (metrics_) metrics_->PushApplied(worker_);
    }
    return absl::OkStatus();
  }

  void Done(const absl::Status& s) {
    if (!s.ok()) LogRejected(*shard_, "PushGradients", worker_, s);
    SerializeTo(response_, resp_);
    if (metrics_) {
      if (!s.ok()) metrics_->PushRejected(s.code());
      metrics_->Sent(M::kPushGradients, resp_->Length());
      metrics_->Request(M::kPushGradients, s.code());
    }
    Finish(proto::ToGrpcStatus(s));
  }

  static constexpr int kChunksField =
      proto::PushGradientsRequest::kChunksFieldNumber;

  Shard* const shard_;
  const int64_t generation_;  // the call's
  ScratchPool* const scratch_;
  ServerMetrics* const metrics_;  // may be null
  grpc::ByteBuffer* const resp_;
  grpc::ByteBuffer message_;
  ScratchPool::Buffer staging_;
  size_t staged_ = 0;  // floats of the current tensor in staging_
  proto::TensorReader reader_;
  bool started_ = false;
  int worker_ = -1;
  int64_t step_ = 0;
  int64_t samples_ = 0;
  proto::PushGradientsResponse response_;  // serialized into resp_ at the end
};

// Waits for the requested version, then streams the tensors in chunks that
// reference the store's values (shared, not copied).
class PullReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PullReactor(Shard* shard, grpc::CallbackServerContext* ctx,
              const grpc::ByteBuffer* raw, ServerMetrics* metrics)
      : shard_(shard), metrics_(metrics) {
    if (metrics_) metrics_->Received(M::kPullParameters, raw->Length());
    proto::PullParametersRequest req;
    absl::Status s = ParseRequest(*raw, &req);
    if (s.ok()) {
      worker_ = req.worker();
      s = shard->CheckCaller(req.job(), req.worker());
    }
    if (s.ok() && req.min_version() < 0) {
      s = absl::InvalidArgumentError("negative min_version");
    }
    std::vector<std::string> keys(req.keys().begin(), req.keys().end());
    for (const std::string& key : keys) {
      if (s.ok()) s = shard->CheckOwned(key);
    }
    Shard::GenerationGuard guard(shard, CallGeneration(*ctx));
    if (s.ok()) s = guard.status();
    if (!s.ok()) {
      Done(s);
      return;
    }
    shard->store().Pull(std::move(keys), req.min_version(),
                        WaitDeadline(*shard, *ctx),
                        [this](absl::StatusOr<ParameterStore::Snapshot> snap) {
                          OnSnapshot(std::move(snap));
                        });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void OnSnapshot(absl::StatusOr<ParameterStore::Snapshot> snap) {
    if (!snap.ok()) {
      Done(snap.status());
      return;
    }
    int64_t version = INT64_MAX;
    for (const auto& [key, t] : *snap) version = std::min(version, t.version);
    proto::PullParametersResponse head;
    head.set_version(snap->empty() ? 0 : version);
    // One full chunk per message, small tensors packed together.
    proto::ChunkedMessageBuilder builder(
        head, proto::PullParametersResponse::kChunksFieldNumber,
        proto::kBulkMessageBytes);
    const auto keep = [this](grpc::ByteBuffer m) {
      messages_.push_back(std::move(m));
      return true;
    };
    for (const auto& [key, t] : *snap) {
      builder.AddTensor(key, t.shape, *t.values, t.values, keep);
    }
    messages_.push_back(builder.Build());
    WriteNext();
  }

  void WriteNext() {
    if (next_ < messages_.size()) {
      if (metrics_) metrics_->Sent(M::kPullParameters, messages_[next_].Length());
      StartWrite(&messages_[next_++]);
    } else {
      End(grpc::Status::OK);
    }
  }

  void Done(const absl::Status& s) {
    if (!s.ok()) LogRejected(*shard_, "PullParameters", worker_, s);
    End(proto::ToGrpcStatus(s));
  }

  void End(const grpc::Status& s) {
    if (metrics_) metrics_->Request(M::kPullParameters, proto::FromGrpcStatus(s).code());
    Finish(s);
  }

  Shard* const shard_;
  ServerMetrics* const metrics_;  // may be null
  int worker_ = -1;
  std::vector<grpc::ByteBuffer> messages_;
  size_t next_ = 0;
};

// One worker's long-lived BN stream. Requests are dispatched as they arrive;
// answers come back through callbacks (maybe on other threads) and are written
// in the order they become ready, one write at a time. Messages are parsed and
// serialized by protobuf's generated classes (as a typed stream would). Bytes
// that are not a BnRequest end the stream with INVALID_ARGUMENT once the answers to the
// requests before them are written.
class BnReactor
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  BnReactor(Shard* shard, ServerMetrics* metrics, int64_t generation)
      : shard_(shard), metrics_(metrics), generation_(generation) {
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    absl::Status malformed;
    if (ok) {
      if (metrics_) metrics_->Received(M::kBnSync, req_.Length());
      malformed = ParseRequest(req_, &msg_);
      req_.Clear();  // for the next read
    }
    if (!ok || !malformed.ok()) {
      if (!malformed.ok()) {
        // The parse failed: the sender is not known.
        LogRejected(*shard_, "BnSync", -1, malformed);
      }
      {
        absl::MutexLock lock(&mu_);
        reads_done_ = true;
        end_ = proto::ToGrpcStatus(malformed);
      }
      MaybeFinish();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      ++outstanding_;
    }
    // Answer first, then read on: a pending read makes gRPC announce the
    // window the request used at once, and the answer should not queue
    // behind that announcement.
    // Dispatch copies what it keeps from msg_, so msg_ and req_ (cleared
    // after the parse) serve the next read too.
    Dispatch(msg_);
    StartRead(&req_);
  }

  void OnWriteDone(bool ok) override {
    const grpc::ByteBuffer* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok) {
        broken_ = true;
        queue_.clear();
      }
      if (!queue_.empty()) {
        next = &queue_.front();
      } else {
        writing_ = false;
      }
    }
    if (next != nullptr) {
      StartWrite(next);
    } else {
      MaybeFinish();
    }
  }

  void OnDone() override { delete this; }

 private:
  void Dispatch(const proto::BnRequest& req) {
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
                  step](const absl::StatusOr<BnAggregator::Reply>& r) {
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
      grpc::ByteBuffer message;
      SerializeTo(resp, &message);
      if (metrics_) metrics_->Sent(M::kBnSync, message.Length());
      Send(std::move(message));
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

  // Queues an answer; starts writing if no write is in flight.
  void Send(grpc::ByteBuffer resp) {
    const grpc::ByteBuffer* start = nullptr;
    {
      absl::MutexLock lock(&mu_);
      --outstanding_;
      if (!broken_) {
        queue_.push_back(std::move(resp));
        if (!writing_) {
          writing_ = true;
          start = &queue_.front();
        }
      }
    }
    if (start != nullptr) {
      StartWrite(start);
    } else {
      MaybeFinish();
    }
  }

  // Finishes once the client stopped sending and every answer went out.
  void MaybeFinish() {
    grpc::Status end;
    {
      absl::MutexLock lock(&mu_);
      if (!reads_done_ || outstanding_ > 0 || writing_ || finished_) return;
      finished_ = true;
      end = end_;
    }
    if (metrics_) metrics_->Request(M::kBnSync, proto::FromGrpcStatus(end).code());
    Finish(end);
  }

  Shard* const shard_;
  ServerMetrics* const metrics_;  // may be null
  const int64_t generation_;  // the stream's
  // Touched only by the read path.
  grpc::ByteBuffer req_;
  proto::BnRequest msg_;
  ServerMetrics::LayerCache layer_cache_{metrics_};

  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_ ABSL_GUARDED_BY(mu_);  // how the stream ends
};

}  // namespace

absl::Status ShardService::Authenticate(
    const grpc::CallbackServerContext& ctx) const {
  if (token_.empty()) return absl::OkStatus();  // no metadata lookup
  return security::CheckToken(token_, CallToken(ctx));
}

template <typename Request>
absl::Status ShardService::Admit(const grpc::CallbackServerContext& ctx,
                                 const grpc::ByteBuffer& raw,
                                 Request* req) const {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return s;
  return ParseRequest(raw, req);
}

grpc::ServerUnaryReactor* ShardService::Answer(
    ServerMetrics::Method method, grpc::CallbackServerContext* ctx,
    const grpc::ByteBuffer& raw, int worker, const absl::Status& s,
    const google::protobuf::MessageLite* resp, grpc::ByteBuffer* out) {
  if (metrics_ != nullptr) {
    metrics_->Received(method, raw.Length());
    if (s.ok() && resp != nullptr) {
      metrics_->Sent(method, static_cast<int64_t>(resp->ByteSizeLong()));
    }
    metrics_->Request(method, s.code());
  }
  return Respond(ctx, *shard_, ServerMetrics::MethodName(method), worker, s,
                 resp, out);
}

grpc::ServerUnaryReactor* ShardService::Register(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  const ShardOptions& o = shard_->options();
  proto::RegisterRequest req;
  proto::RegisterResponse resp;
  absl::Status s = Admit(*ctx, *raw, &req);
  const int worker = s.ok() ? req.worker() : -1;
  if (s.ok()) s = shard_->CheckCaller(req.job(), req.worker());
  if (s.ok() && (req.num_workers() != o.num_workers ||
                 req.num_shards() != o.num_shards)) {
    s = absl::FailedPreconditionError(absl::StrCat(
        "worker expects ", req.num_workers(), " workers and ", req.num_shards(),
        " shards; this server runs ", o.num_workers, " workers and ",
        o.num_shards, " shards"));
  }
  if (s.ok()) s = shard_->Register(req.worker(), req.incarnation());
  if (s.ok()) {
    *resp.mutable_config() = ToJobConfig(o);
    resp.set_server_incarnation(shard_->server_incarnation());
    resp.set_generation(shard_->generation().generation);
  }
  return Answer(M::kRegister, ctx, *raw, worker, s, &resp, out);
}

grpc::ServerUnaryReactor* ShardService::Heartbeat(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::HeartbeatRequest req;
  proto::HeartbeatResponse resp;
  absl::Status s = Admit(*ctx, *raw, &req);
  const int worker = s.ok() ? req.worker() : -1;
  if (s.ok()) s = shard_->CheckCaller(req.job(), req.worker());
  if (s.ok()) {
    s = shard_->membership().Heartbeat(req.worker(), req.incarnation(),
                                       shard_->options().now());
  }
  if (s.ok()) {
    for (int w : shard_->membership().LiveWorkers()) resp.add_live_workers(w);
    const Shard::GenerationInfo g = shard_->generation();
    resp.set_server_incarnation(shard_->server_incarnation());
    resp.set_generation(g.generation);
    resp.set_needs_rollback(g.needs_rollback);
  }
  return Answer(M::kHeartbeat, ctx, *raw, worker, s, &resp, out);
}

grpc::ServerUnaryReactor* ShardService::InitParameters(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::InitParametersRequest req;
  proto::InitParametersResponse resp;
  absl::Status s = Admit(*ctx, *raw, &req);
  const int worker = s.ok() ? req.worker() : -1;
  if (s.ok()) s = shard_->CheckCaller(req.job(), req.worker());
  Shard::GenerationGuard guard(shard_, CallGeneration(*ctx));
  if (s.ok()) s = guard.status();
  for (const proto::NamedTensor& p : req.parameters()) {
    if (!s.ok()) break;
    if (p.key().empty() || p.key().size() > proto::kMaxKeyBytes) {
      s = absl::InvalidArgumentError("parameter key must have 1 to 256 bytes");
      break;
    }
    s = shard_->CheckOwned(p.key());
    if (!s.ok()) break;
    absl::StatusOr<std::vector<float>> values = proto::DecodeFloat32(p.value());
    if (!values.ok()) {
      s = absl::InvalidArgumentError(
          absl::StrCat("parameter '", p.key(), "': ", values.status().message()));
      break;
    }
    absl::StatusOr<bool> fresh = shard_->store().Init(
        p.key(), {p.value().shape().begin(), p.value().shape().end()},
        *std::move(values));
    if (!fresh.ok()) {
      s = fresh.status();
      break;
    }
    if (*fresh) {
      resp.set_initialized(resp.initialized() + 1);
    } else {
      resp.set_already(resp.already() + 1);
    }
  }
  return Answer(M::kInitParameters, ctx, *raw, worker, s, &resp, out);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* ShardService::PushGradients(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  if (absl::Status s = Authenticate(*ctx); !s.ok()) {
    LogRejected(*shard_, "PushGradients", -1, s);
    if (metrics_) metrics_->Request(M::kPushGradients, s.code());
    return new Refused<grpc::ServerReadReactor<grpc::ByteBuffer>>(s);
  }
  if (absl::Status s = shard_->CheckGeneration(CallGeneration(*ctx)); !s.ok()) {
    LogRejected(*shard_, "PushGradients", -1, s);
    if (metrics_) metrics_->Request(M::kPushGradients, s.code());
    return new Refused<grpc::ServerReadReactor<grpc::ByteBuffer>>(s);
  }
  return new PushReactor(shard_, &scratch_, resp, metrics_,
                         CallGeneration(*ctx));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ShardService::PullParameters(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  if (absl::Status s = Authenticate(*ctx); !s.ok()) {
    LogRejected(*shard_, "PullParameters", -1, s);
    if (metrics_) metrics_->Request(M::kPullParameters, s.code());
    return new Refused<grpc::ServerWriteReactor<grpc::ByteBuffer>>(s);
  }
  if (absl::Status s = shard_->CheckGeneration(CallGeneration(*ctx)); !s.ok()) {
    LogRejected(*shard_, "PullParameters", -1, s);
    if (metrics_) metrics_->Request(M::kPullParameters, s.code());
    return new Refused<grpc::ServerWriteReactor<grpc::ByteBuffer>>(s);
  }
  return new PullReactor(shard_, ctx, req, metrics_);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ShardService::BnSync(grpc::CallbackServerContext* ctx) {
  if (absl::Status s = Authenticate(*ctx); !s.ok()) {
    LogRejected(*shard_, "BnSync", -1, s);
    if (metrics_) metrics_->Request(M::kBnSync, s.code());
    return new Refused<
        grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>(s);
  }
  return new BnReactor(shard_, metrics_, CallGeneration(*ctx));
}

grpc::ServerUnaryReactor* ShardService::StartStep(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::StartStepRequest req;
  absl::Status s = Admit(*ctx, *raw, &req);
  const int worker = s.ok() ? req.worker() : -1;
  if (s.ok()) s = shard_->CheckCaller(req.job(), req.worker());
  Shard::GenerationGuard guard(shard_, CallGeneration(*ctx));
  if (s.ok()) s = guard.status();
  if (s.ok() && shard_->clocks() == nullptr) {
    s = absl::FailedPreconditionError(
        "step clocks are kept by shard 0 under the async policy only");
  }
  if (!s.ok()) return Answer(M::kStartStep, ctx, *raw, worker, s);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  Shard* shard = shard_;
  ServerMetrics* metrics = metrics_;
  if (metrics) metrics->Received(M::kStartStep, raw->Length());
  shard_->clocks()->StartStep(
      worker, req.step(), WaitDeadline(*shard_, *ctx),
      [reactor, out, shard, worker, metrics](absl::StatusOr<int64_t> min_clock) {
        if (min_clock.ok()) {
          proto::StartStepResponse resp;
          resp.set_min_clock(*min_clock);
          SerializeTo(resp, out);
          if (metrics) metrics->Sent(M::kStartStep, out->Length());
        } else {
          LogRejected(*shard, "StartStep", worker, min_clock.status());
        }
        if (metrics) metrics->Request(M::kStartStep, min_clock.status().code());
        reactor->Finish(proto::ToGrpcStatus(min_clock.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* ShardService::FinishStep(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::FinishStepRequest req;
  absl::Status s = Admit(*ctx, *raw, &req);
  const int worker = s.ok() ? req.worker() : -1;
  if (s.ok()) s = shard_->CheckCaller(req.job(), req.worker());
  Shard::GenerationGuard guard(shard_, CallGeneration(*ctx));
  if (s.ok()) s = guard.status();
  if (s.ok() && shard_->clocks() == nullptr) {
    s = absl::FailedPreconditionError(
        "step clocks are kept by shard 0 under the async policy only");
  }
  if (s.ok()) s = shard_->clocks()->FinishStep(req.worker(), req.completed());
  const proto::FinishStepResponse resp;
  return Answer(M::kFinishStep, ctx, *raw, worker, s, &resp, out);
}

grpc::ServerUnaryReactor* ShardService::GetStatus(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::StatusRequest req;
  if (absl::Status s = Admit(*ctx, *raw, &req); !s.ok()) {
    return Answer(M::kGetStatus, ctx, *raw, -1, s);
  }
  proto::StatusResponse resp;
  *resp.mutable_config() = ToJobConfig(shard_->options());
  const absl::Time now = shard_->options().now();
  const std::vector<Membership::WorkerInfo> workers =
      shard_->membership().Snapshot();
  for (size_t w = 0; w < workers.size(); ++w) {
    proto::WorkerStatus* ws = resp.add_workers();
    ws->set_worker(static_cast<int>(w));
    ws->set_registered(workers[w].registered);
    ws->set_live(workers[w].registered && !workers[w].lost);
    ws->set_clock(shard_->clocks() ? shard_->clocks()->clock(w) : -1);
    ws->set_ms_since_heartbeat(
        workers[w].registered ? absl::ToInt64Milliseconds(now - workers[w].last_seen)
                              : -1);
    ws->set_took_part(shard_->TookPart(static_cast<int>(w)));
  }
  const Shard::GenerationInfo g = shard_->generation();
  resp.set_server_incarnation(shard_->server_incarnation());
  resp.set_generation(g.generation);
  resp.set_needs_rollback(g.needs_rollback);
  resp.set_restored_step(g.restored_step);
  resp.set_checkpoint_dir(shard_->options().checkpoint_dir);
  if (!shard_->options().checkpoint_dir.empty()) {
    absl::StatusOr<std::vector<int64_t>> steps =
        ListCheckpoints(shard_->options().checkpoint_dir);
    if (steps.ok()) {
      for (int64_t k : *steps) resp.add_checkpoint_steps(k);
    }
  }
  if (metrics_) metrics_->FillStatus(&resp);
  const ParameterStore::Stats stats = shard_->store().GetStats();
  resp.set_num_parameters(stats.num_keys);
  resp.set_min_version(stats.min_version);
  resp.set_pushes_applied(stats.applied);
  resp.set_pushes_duplicate(stats.duplicates);
  resp.set_num_bn_layers(shard_->bn().num_layers());
  return Answer(M::kGetStatus, ctx, *raw, -1, absl::OkStatus(),
                &resp, out);
}

grpc::ServerUnaryReactor* ShardService::Rollback(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::RollbackRequest req;
  proto::RollbackResponse resp;
  absl::Status s = Admit(*ctx, *raw, &req);
  const int worker = s.ok() ? req.worker() : -1;
  if (s.ok()) s = shard_->CheckCaller(req.job(), req.worker());
  if (s.ok()) {
    absl::StatusOr<int64_t> step = shard_->Rollback(req.generation(), req.step());
    s = step.status();
    if (s.ok()) {
      resp.set_generation(req.generation());
      resp.set_step(*step);
      resp.set_resume_step(shard_->ResumeStep(req.worker()));
    }
  }
  return Answer(M::kRollback, ctx, *raw, worker, s, &resp, out);
}

grpc::ServerUnaryReactor* ShardService::GetDigest(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::DigestRequest req;
  if (absl::Status s = Admit(*ctx, *raw, &req); !s.ok()) {
    return Answer(M::kGetDigest, ctx, *raw, -1, s);
  }
  proto::DigestResponse resp;
  const Shard::Digest digest = shard_->ComputeDigest();
  for (const auto& [key, hash] : digest.entries) {
    proto::DigestResponse::Entry* e = resp.add_entries();
    e->set_key(key);
    e->set_sha256(hash);
  }
  resp.set_step(digest.step);
  return Answer(M::kGetDigest, ctx, *raw, -1, absl::OkStatus(), &resp,
                out);
}

}  // namespace bnps::server
