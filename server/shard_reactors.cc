#include "server/shard_reactors.h"

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
#include "server/bn_dispatch.h"
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
  BnReactor(Shard* shard, ServerMetrics* metrics, int64_t generation,
            util::KeepAwake* keep_awake)
      : shard_(shard),
        metrics_(metrics),
        generation_(generation),
        keep_awake_(keep_awake) {
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    absl::Status malformed;
    if (ok) {
      if (keep_awake_ != nullptr) keep_awake_->Touch();
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
    dispatcher_.Dispatch(req, [this](const proto::BnResponse& resp) {
      grpc::ByteBuffer message;
      SerializeTo(resp, &message);
      if (metrics_) metrics_->Sent(M::kBnSync, message.Length());
      Send(std::move(message));
    });
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
  util::KeepAwake* const keep_awake_;  // may be null
  // Touched only by the read path.
  grpc::ByteBuffer req_;
  proto::BnRequest msg_;
  BnDispatcher dispatcher_{shard_, metrics_, generation_};

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

grpc::ServerReadReactor<grpc::ByteBuffer>* NewPushReactor(
    Shard* shard, ScratchPool* scratch, grpc::ByteBuffer* resp,
    ServerMetrics* metrics, int64_t generation) {
  return new PushReactor(shard, scratch, resp, metrics, generation);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewPullReactor(
    Shard* shard, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    ServerMetrics* metrics) {
  return new PullReactor(shard, ctx, raw, metrics);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewBnReactor(
    Shard* shard, ServerMetrics* metrics, int64_t generation,
    util::KeepAwake* keep_awake) {
  return new BnReactor(shard, metrics, generation, keep_awake);
}

}  // namespace bnps::server
