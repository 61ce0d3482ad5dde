#include "server/shard_reactors.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "proto/codec.h"
#include "security/job_token.h"
#include "server/bn_dispatch.h"
#include "checkpoint/checkpoint.h"
#include "proto/limits.h"
#include "proto/tensor_wire.h"
#include "server/rpc_util.h"
#include "server/write_queue.h"

namespace bnps::server {
namespace {

using M = ServerMetrics;  // its enums; metrics_ may be null everywhere

// Gradients of one step arrive as chunks (framed by proto/tensor_wire); each
// tensor is read straight into a staging buffer and pushed once complete.
class PushReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  PushReactor(Shard* shard, ScratchPool* scratch, grpc::ByteBuffer* resp,
              ServerMetrics* metrics, int64_t generation, int caller)
      : shard_(shard),
        generation_(generation),
        caller_(caller),
        scratch_(scratch),
        metrics_(metrics),
        resp_(resp),
        reader_(
            [this](const std::string& key, absl::Span<const int64_t> shape,
                   int64_t n) -> absl::StatusOr<float*> {
              if (absl::Status s = shard_->CheckOwned(key); !s.ok()) return s;
              // Checked in the push's generation, as PushTensor stores it:
              // a push of a generation rolled back since is told so
              // (ABORTED), not that its step is from the future.
              AdmissionRequest a;
              a.caller = caller_;
              a.generation = generation_;
              const absl::StatusOr<Admission> admitted = shard_->Admit(a);
              if (!admitted.ok()) return admitted.status();
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
      AdmissionRequest a;
      a.caller = caller_;
      a.job = head.job();
      a.worker = head.worker();
      if (absl::Status s = shard_->Admit(a).status(); !s.ok()) return s;
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
    AdmissionRequest a;
    a.caller = caller_;
    a.generation = generation_;
    const absl::StatusOr<Admission> admitted = shard_->Admit(a);
    if (!admitted.ok()) return admitted.status();
    absl::StatusOr<store::ParameterStore::PushResult> r = shard_->store().Push(
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
  const int caller_;           // who the call's token proved it is
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
// reference the store's values (shared, not copied). With in_order, each run
// of keys the store hands out (store::ParameterStore::PullInOrder) is written as
// soon as it is ready, and the call ends once the store's pull ended (so no
// callback of it outlives the reactor).
class PullReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PullReactor(Shard* shard, grpc::CallbackServerContext* ctx,
              const grpc::ByteBuffer* raw, ServerMetrics* metrics, int caller)
      : shard_(shard), metrics_(metrics) {
    if (metrics_) metrics_->Received(M::kPullParameters, raw->Length());
    proto::PullParametersRequest req;
    absl::Status s = ParseRequest(*raw, &req);
    std::vector<std::string> keys(req.keys().begin(), req.keys().end());
    absl::StatusOr<Admission> admitted = Admission();
    if (s.ok()) {
      worker_ = req.worker();
      AdmissionRequest a;
      a.caller = caller;
      a.job = req.job();
      a.worker = req.worker();
      a.keys = keys;
      a.generation = CallGeneration(*ctx);
      admitted = shard->Admit(a);
      s = admitted.status();
    }
    if (s.ok() && req.min_version() < 0) {
      s = absl::InvalidArgumentError("negative min_version");
    }
    if (!s.ok()) {
      Done(s);
      return;
    }
    if (req.in_order()) {
      shard->store().PullInOrder(
          std::move(keys), req.min_version(), WaitDeadline(*shard, *ctx),
          [this](absl::StatusOr<store::ParameterStore::PullPart> part) {
            OnPart(std::move(part));
          });
      return;
    }
    shard->store().Pull(std::move(keys), req.min_version(),
                        WaitDeadline(*shard, *ctx),
                        [this](absl::StatusOr<store::ParameterStore::Snapshot> snap) {
                          OnSnapshot(std::move(snap));
                        });
  }

  void OnWriteDone(bool ok) override {
    const grpc::ByteBuffer* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      next = queue_.WriteDone(ok);
    }
    if (next != nullptr) {
      Write(next);
    } else {
      MaybeFinish();
    }
  }

  void OnDone() override { delete this; }

 private:
  void OnSnapshot(absl::StatusOr<store::ParameterStore::Snapshot> snap) {
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
    std::vector<grpc::ByteBuffer> messages;
    const auto keep = [&messages](grpc::ByteBuffer m) {
      messages.push_back(std::move(m));
      return true;
    };
    for (const auto& [key, t] : *snap) {
      builder.AddTensor(key, t.shape, *t.values, t.values, keep);
    }
    messages.push_back(builder.Build());
    Send(std::move(messages), absl::OkStatus());
  }

  // The keys of one run, packed as OnSnapshot packs them; the run's
  // messages carry its smallest version.
  void OnPart(absl::StatusOr<store::ParameterStore::PullPart> part) {
    if (!part.ok()) {
      LogRejected(*shard_, "PullParameters", worker_, part.status());
      Send({}, part.status());
      return;
    }
    std::vector<grpc::ByteBuffer> messages;
    if (!part->tensors.empty()) {
      int64_t version = INT64_MAX;
      for (const auto& [key, t] : part->tensors) {
        version = std::min(version, t.version);
      }
      proto::PullParametersResponse head;
      head.set_version(version);
      proto::ChunkedMessageBuilder builder(
          head, proto::PullParametersResponse::kChunksFieldNumber,
          proto::kBulkMessageBytes);
      const auto keep = [&messages](grpc::ByteBuffer m) {
        messages.push_back(std::move(m));
        return true;
      };
      for (const auto& [key, t] : part->tensors) {
        builder.AddTensor(key, t.shape, *t.values, t.values, keep);
      }
      messages.push_back(builder.Build());
    }
    Send(std::move(messages), part->last ? std::optional(absl::OkStatus())
                                         : std::nullopt);
  }

  // Queues `messages` and starts writing if no write is in flight; `end`,
  // if set, is how the call ends once they are written.
  void Send(std::vector<grpc::ByteBuffer> messages,
            std::optional<absl::Status> end) {
    const grpc::ByteBuffer* start = nullptr;
    {
      absl::MutexLock lock(&mu_);
      for (grpc::ByteBuffer& m : messages) {
        if (const grpc::ByteBuffer* w = queue_.Push(std::move(m))) start = w;
      }
      if (end.has_value()) {
        ended_ = true;
        end_ = *std::move(end);
      }
    }
    if (start != nullptr) {
      Write(start);
    } else {
      MaybeFinish();
    }
  }

  void Write(const grpc::ByteBuffer* m) {
    if (metrics_) metrics_->Sent(M::kPullParameters, m->Length());
    StartWrite(m);
  }

  // Finishes once the store's answer is complete and written (or the client
  // went away).
  void MaybeFinish() {
    grpc::Status end;
    {
      absl::MutexLock lock(&mu_);
      if (!ended_ || queue_.writing() || finished_) return;
      finished_ = true;
      end = queue_.broken() ? grpc::Status(grpc::StatusCode::CANCELLED,
                                   "client went away")
                    : proto::ToGrpcStatus(end_);
    }
    End(end);
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

  absl::Mutex mu_;
  WriteQueue queue_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;   // the store will call no more
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_ ABSL_GUARDED_BY(mu_);
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
            util::KeepAwake* keep_awake, int caller, Admission stream,
            std::shared_ptr<util::ByteBudget> budget)
      : shard_(shard),
        metrics_(metrics),
        keep_awake_(keep_awake),
        stream_(std::move(stream)),
        budget_(budget),
        dispatcher_(shard, metrics, generation, caller,
                    [this](int64_t bytes) {
                      return CheckAnswerFits(bytes, kMaxUnreadAnswerBytes,
                                             *budget_);
                    }) {
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
      next = queue_.WriteDone(ok);
    }
    if (next != nullptr) {
      StartWrite(next);
    } else {
      MaybeFinish();
    }
  }

  void OnDone() override {
    stream_.Release();
    {
      absl::MutexLock lock(&mu_);
      queue_.Close();  // nothing is written any more
    }
    delete this;
  }

 private:
  void Dispatch(const proto::BnRequest& req) {
    dispatcher_.Dispatch(req, [this](const proto::BnResponse& resp) {
      grpc::ByteBuffer message;
      SerializeTo(resp, &message);
      if (metrics_) metrics_->Sent(M::kBnSync, message.Length());
      Send(std::move(message));
    });
  }

  // Queues an answer; starts writing if no write is in flight. Past the
  // stream's cap of unread answers or the server's budget, the stream is
  // cut off: it answers no more and gives back what it held.
  void Send(grpc::ByteBuffer resp) {
    const grpc::ByteBuffer* start = nullptr;
    int64_t cut_at = -1;
    {
      absl::MutexLock lock(&mu_);
      --outstanding_;
      start = queue_.Push(std::move(resp), &cut_at);
    }
    if (cut_at >= 0) {
      std::fprintf(stderr,
                   "bnps_server: a BnSync stream left %lld bytes of answers "
                   "unread (over its cap, or the server's BN memory budget "
                   "is spent): it answers no more\n",
                   static_cast<long long>(cut_at));
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
      if (!reads_done_ || outstanding_ > 0 || queue_.writing() || finished_) {
        return;
      }
      finished_ = true;
      end = end_;
    }
    if (metrics_) metrics_->Request(M::kBnSync, proto::FromGrpcStatus(end).code());
    Finish(end);
  }

  Shard* const shard_;
  ServerMetrics* const metrics_;  // may be null
  util::KeepAwake* const keep_awake_;  // may be null
  Admission stream_;  // the stream's: holds its worker's claim
  const std::shared_ptr<util::ByteBudget> budget_;
  // Touched only by the read path.
  grpc::ByteBuffer req_;
  proto::BnRequest msg_;
  BnDispatcher dispatcher_;

  absl::Mutex mu_;
  // Answers not yet written, within kMaxUnreadAnswerBytes and budget_.
  WriteQueue queue_ ABSL_GUARDED_BY(mu_){kMaxUnreadAnswerBytes, budget_};
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_ ABSL_GUARDED_BY(mu_);  // how the stream ends
};

// A read-only stream of messages built before the call started.
class ReadStateReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ReadStateReactor(std::vector<grpc::ByteBuffer> messages,
                   ServerMetrics* metrics, std::function<void()> done)
      : messages_(std::move(messages)), metrics_(metrics),
        done_(std::move(done)) {
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client went away
      End(grpc::Status(grpc::StatusCode::CANCELLED, "ReadState cancelled"));
      return;
    }
    Next();
  }
  void OnDone() override {
    if (done_) done_();
    delete this;
  }

 private:
  void Next() {
    if (next_ == messages_.size()) {
      End(grpc::Status::OK);
      return;
    }
    if (metrics_) {
      metrics_->Sent(ServerMetrics::kReadState, messages_[next_].Length());
    }
    StartWrite(&messages_[next_++]);
  }
  void End(const grpc::Status& s) {
    if (metrics_) {
      metrics_->Request(ServerMetrics::kReadState,
                        static_cast<absl::StatusCode>(s.error_code()));
    }
    Finish(s);
  }

  std::vector<grpc::ByteBuffer> messages_;
  size_t next_ = 0;
  ServerMetrics* const metrics_;
  const std::function<void()> done_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewReadStateReactor(
    std::vector<grpc::ByteBuffer> messages, ServerMetrics* metrics,
    std::function<void()> done) {
  return new ReadStateReactor(std::move(messages), metrics, std::move(done));
}

grpc::ServerReadReactor<grpc::ByteBuffer>* NewPushReactor(
    Shard* shard, ScratchPool* scratch, grpc::ByteBuffer* resp,
    ServerMetrics* metrics, int64_t generation, int caller) {
  return new PushReactor(shard, scratch, resp, metrics, generation, caller);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewPullReactor(
    Shard* shard, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    ServerMetrics* metrics, int caller) {
  return new PullReactor(shard, ctx, raw, metrics, caller);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewBnReactor(
    Shard* shard, ServerMetrics* metrics, int64_t generation,
    util::KeepAwake* keep_awake, int caller, Admission stream,
    std::shared_ptr<util::ByteBudget> budget) {
  return new BnReactor(shard, metrics, generation, keep_awake, caller,
                       std::move(stream), std::move(budget));
}

}  // namespace bnps::server
