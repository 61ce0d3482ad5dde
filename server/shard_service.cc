#include "server/shard_service.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "security/job_token.h"
#include "proto/generation.h"
#include "proto/limits.h"
#include "security/worker_token.h"
#include "checkpoint/checkpoint.h"
#include "server/read_state.h"
#include "server/rollback_authority.h"
#include "server/rpc_util.h"
#include "server/shard_reactors.h"

namespace bnps::server {

namespace {

using M = ServerMetrics;  // its enums; metrics_ may be null everywhere

// StartStep and FinishStep need the shard's step clocks.
absl::Status HasClocks(Shard& shard) {
  if (shard.clocks() != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "step clocks are kept by shard 0 under the async policy only");
}

// The shard's grounds for a new generation (server/rollback_authority.h),
// as `caller` asks.
RollbackGrounds GroundsOf(const Shard& shard, int caller) {
  const Shard::GenerationInfo g = shard.generation();
  RollbackGrounds grounds;
  grounds.generation = g.generation;
  grounds.needs_rollback = g.needs_rollback;
  grounds.failure_seen = g.failure_seen;
  grounds.caller_joins = caller >= 0 && shard.Joining(caller);
  return grounds;
}

}  // namespace

absl::StatusOr<int> ShardService::Authenticate(
    ServerMetrics::Method method, const grpc::CallbackServerContext& ctx) const {
  const std::string name =
      absl::StrCat("/", proto::ParameterServer::service_full_name(), "/",
                   ServerMetrics::MethodName(method));
  absl::StatusOr<int> caller =
      AuthenticateCall(ctx, name, auth_, sessions_.get());
  if (caller.ok() && keep_awake_ != nullptr) keep_awake_->Touch();
  return caller;
}

template <typename Request>
absl::Status ShardService::Decode(ServerMetrics::Method method,
                                  const grpc::CallbackServerContext& ctx,
                                  const grpc::ByteBuffer& raw, Request* req,
                                  int* caller, bool names_worker) const {
  absl::StatusOr<int> who = Authenticate(method, ctx);
  if (!who.ok()) return who.status();
  *caller = *who;
  if (names_worker && raw.Length() == 0) {
    return absl::InvalidArgumentError(
        "empty request: it names no job and no worker (a call cancelled on "
        "its way, e.g. held up past its deadline, arrives so)");
  }
  return ParseRequest(raw, req);
}

template <typename Request>
absl::StatusOr<Admission> ShardService::AdmitWorkerCall(
    ServerMetrics::Method method, const grpc::CallbackServerContext& ctx,
    const grpc::ByteBuffer& raw, Request* req, int* worker,
    bool generation_checked, int* caller) {
  AdmissionRequest a;
  if (absl::Status s = Decode(method, ctx, raw, req, &a.caller); !s.ok()) {
    return s;
  }
  if (caller != nullptr) *caller = a.caller;
  *worker = req->worker();
  a.job = req->job();
  a.worker = req->worker();
  if (generation_checked) a.generation = CallGeneration(ctx);
  return shard_->Admit(a);
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
  int worker = -1;
  const absl::StatusOr<Admission> admitted =
      AdmitWorkerCall(M::kRegister, *ctx, *raw, &req, &worker,
                      /*generation_checked=*/false);
  absl::Status s = admitted.status();
  if (s.ok() && (req.num_workers() != o.num_workers ||
                 req.num_shards() != o.num_shards)) {
    s = absl::FailedPreconditionError(absl::StrCat(
        "worker expects ", req.num_workers(), " workers and ", req.num_shards(),
        " shards; this server runs ", o.num_workers, " workers and ",
        o.num_shards, " shards"));
  }
  if (s.ok()) s = shard_->Register(req.worker(), req.incarnation(), req.host());
  if (s.ok()) {
    shard_->membership().SetAddress(req.worker(), PeerHost(ctx->peer()));
    // The generation before the config: a rollback changes the membership
    // before it publishes its generation (Shard::Rollback), so the answer
    // never pairs a generation with an older membership.
    resp.set_generation(shard_->generation().generation);
    *resp.mutable_config() = shard_->config();
    resp.set_server_incarnation(shard_->server_incarnation());
    resp.set_bn_port(bn_socket_ != nullptr ? bn_socket_->port() : 0);
    if (bn_socket_ != nullptr) resp.set_bn_unix_path(bn_socket_->unix_path());
  }
  return Answer(M::kRegister, ctx, *raw, worker, s, &resp, out);
}

grpc::ServerUnaryReactor* ShardService::Heartbeat(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::HeartbeatRequest req;
  proto::HeartbeatResponse resp;
  int worker = -1;
  const absl::StatusOr<Admission> admitted =
      AdmitWorkerCall(M::kHeartbeat, *ctx, *raw, &req, &worker,
                      /*generation_checked=*/false);
  absl::Status s = admitted.status();
  if (s.ok()) {
    s = shard_->Heartbeat(req.worker(), req.incarnation());
  }
  if (s.ok()) {
    shard_->membership().SetAddress(req.worker(), PeerHost(ctx->peer()));
    if (!req.losses().empty()) {
      std::vector<Membership::Loss> news;
      for (const proto::WorkerLoss& l : req.losses()) {
        news.push_back(
            {l.worker(), l.incarnation(), l.shard(), l.reason(), l.seal()});
      }
      shard_->LearnLosses(news);
    }
    for (const Membership::Loss& l : shard_->Losses()) {
      proto::WorkerLoss* out_loss = resp.add_lost();
      out_loss->set_worker(l.worker);
      out_loss->set_incarnation(l.incarnation);
      out_loss->set_shard(l.shard);
      out_loss->set_reason(l.reason);
      out_loss->set_seal(l.seal);
    }
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
  int worker = -1;
  const absl::StatusOr<Admission> admitted =
      AdmitWorkerCall(M::kInitParameters, *ctx, *raw, &req, &worker,
                      /*generation_checked=*/true);
  absl::Status s = admitted.status();
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
  absl::StatusOr<int> caller = Authenticate(M::kPushGradients, *ctx);
  if (!caller.ok()) {
    const absl::Status& s = caller.status();
    LogRejected(*shard_, "PushGradients", -1, s);
    if (metrics_) metrics_->Request(M::kPushGradients, s.code());
    return new Refused<grpc::ServerReadReactor<grpc::ByteBuffer>>(s);
  }
  // Refused before any chunk is read; each tensor is admitted again as it
  // reaches the store.
  AdmissionRequest a;
  a.caller = *caller;
  a.generation = CallGeneration(*ctx);
  if (absl::Status s = shard_->Admit(a).status(); !s.ok()) {
    LogRejected(*shard_, "PushGradients", -1, s);
    if (metrics_) metrics_->Request(M::kPushGradients, s.code());
    return new Refused<grpc::ServerReadReactor<grpc::ByteBuffer>>(s);
  }
  return NewPushReactor(shard_, &scratch_, resp, metrics_,
                         CallGeneration(*ctx), *caller);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ShardService::PullParameters(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  absl::StatusOr<int> caller = Authenticate(M::kPullParameters, *ctx);
  if (!caller.ok()) {
    const absl::Status& s = caller.status();
    LogRejected(*shard_, "PullParameters", -1, s);
    if (metrics_) metrics_->Request(M::kPullParameters, s.code());
    return new Refused<grpc::ServerWriteReactor<grpc::ByteBuffer>>(s);
  }
  return NewPullReactor(shard_, ctx, req, metrics_, *caller);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ShardService::BnSync(grpc::CallbackServerContext* ctx) {
  absl::StatusOr<int> caller = Authenticate(M::kBnSync, *ctx);
  AdmissionRequest a;
  a.caller = caller.ok() ? *caller : Shard::kAnyWorker;
  a.connection = BnTransport::kStream;
  a.connection_generation = CallGeneration(*ctx);
  absl::StatusOr<Admission> stream =
      caller.ok() ? shard_->Admit(a) : caller.status();
  if (const absl::Status& s = stream.status(); !s.ok()) {
    LogRejected(*shard_, "BnSync", caller.ok() ? *caller : -1, s);
    if (metrics_) metrics_->Request(M::kBnSync, s.code());
    return new Refused<
        grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>(s);
  }
  return NewBnReactor(shard_, metrics_, CallGeneration(*ctx), keep_awake_,
                      *caller, *std::move(stream), bn_budget_);
}

grpc::ServerUnaryReactor* ShardService::StartStep(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::StartStepRequest req;
  int worker = -1;
  const absl::StatusOr<Admission> admitted =
      AdmitWorkerCall(M::kStartStep, *ctx, *raw, &req, &worker,
                      /*generation_checked=*/true);
  absl::Status s = admitted.status();
  if (s.ok()) s = HasClocks(*shard_);
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
  int worker = -1;
  const absl::StatusOr<Admission> admitted =
      AdmitWorkerCall(M::kFinishStep, *ctx, *raw, &req, &worker,
                      /*generation_checked=*/true);
  absl::Status s = admitted.status();
  if (s.ok()) s = HasClocks(*shard_);
  if (s.ok()) s = shard_->clocks()->FinishStep(req.worker(), req.completed());
  const proto::FinishStepResponse resp;
  return Answer(M::kFinishStep, ctx, *raw, worker, s, &resp, out);
}

grpc::ServerUnaryReactor* ShardService::GetStatus(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::StatusRequest req;
  int caller = Shard::kAnyWorker;  // status and digest name no worker
  if (absl::Status s = Decode(M::kGetStatus, *ctx, *raw, &req, &caller,
                              /*names_worker=*/false);
      !s.ok()) {
    return Answer(M::kGetStatus, ctx, *raw, -1, s);
  }
  proto::StatusResponse resp;
  *resp.mutable_config() = shard_->config();
  const absl::Time now = shard_->options().now();
  const std::vector<Membership::WorkerInfo> workers =
      shard_->membership().Snapshot();
  for (size_t w = 0; w < workers.size(); ++w) {
    proto::WorkerStatus* ws = resp.add_workers();
    ws->set_worker(static_cast<int>(w));
    ws->set_registered(workers[w].registered);
    ws->set_live(workers[w].registered && !workers[w].lost &&
                 !workers[w].finished);
    ws->set_clock(shard_->clocks() ? shard_->clocks()->clock(w) : -1);
    ws->set_ms_since_heartbeat(
        workers[w].registered ? absl::ToInt64Milliseconds(now - workers[w].last_seen)
                              : -1);
    ws->set_took_part(shard_->TookPart(static_cast<int>(w)));
    ws->set_finished(workers[w].finished);
  }
  resp.set_job_complete(shard_->job_complete());
  const Shard::GenerationInfo g = shard_->generation();
  resp.set_server_incarnation(shard_->server_incarnation());
  resp.set_generation(g.generation);
  resp.set_needs_rollback(g.needs_rollback);
  resp.set_restored_step(g.restored_step);
  if (req.next_generation() > 0) {
    resp.set_generation_warrant(
        FailureWarrant(shard_->options().seal_key, shard_->options().job,
                       GroundsOf(*shard_, caller), req.next_generation()));
  }
  resp.set_checkpoint_dir(shard_->options().checkpoint_dir);
  if (!shard_->options().checkpoint_dir.empty()) {
    absl::StatusOr<std::vector<int64_t>> steps =
        checkpoint::ListCheckpoints(shard_->options().checkpoint_dir);
    if (steps.ok()) {
      for (int64_t k : *steps) resp.add_checkpoint_steps(k);
    }
  }
  if (metrics_) metrics_->FillStatus(&resp);
  const store::ParameterStore::Stats stats = shard_->store().GetStats();
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
  int worker = -1, caller = -1;
  const absl::StatusOr<Admission> admitted = AdmitWorkerCall(
      M::kRollback, *ctx, *raw, &req, &worker, /*generation_checked=*/false,
      &caller);
  absl::Status s = admitted.status();
  if (s.ok()) {
    s = CheckRollbackAuthority(shard_->options().seal_key,
                               shard_->options().job, caller,
                               GroundsOf(*shard_, caller), req);
  }
  if (s.ok()) {
    Shard::MembershipChange change;
    change.resize_to = req.resize_to();
    change.shrink_to = req.shrink_to();
    change.leaver = req.worker();
    if (req.membership_size() > 0) {
      absl::StatusOr<proto::MembershipHistory> h =
          proto::MembershipHistory::FromSegments(
              shard_->options().num_workers, req.membership());
      s = h.status();
      if (h.ok()) change.adopt = *std::move(h);
    }
    absl::StatusOr<int64_t> step =
        s.ok() ? shard_->Rollback(req.generation(), req.step(), change)
               : absl::StatusOr<int64_t>(s);
    s = step.status();
    if (s.ok()) {
      resp.set_generation(req.generation());
      resp.set_step(*step);
      resp.set_resume_step(shard_->ResumeStep(req.worker()));
      shard_->history().ToSegments(resp.mutable_membership());
      resp.set_warrant(DecidedWarrant(shard_->options().seal_key,
                                      shard_->options().job, req.generation(),
                                      resp.membership()));
    }
  }
  return Answer(M::kRollback, ctx, *raw, worker, s, &resp, out);
}

grpc::ServerUnaryReactor* ShardService::GetDigest(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::DigestRequest req;
  int caller = Shard::kAnyWorker;  // status and digest name no worker
  if (absl::Status s = Decode(M::kGetDigest, *ctx, *raw, &req, &caller,
                              /*names_worker=*/false);
      !s.ok()) {
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

grpc::ServerUnaryReactor* ShardService::Leave(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* raw,
                                              grpc::ByteBuffer* out) {
  proto::LeaveRequest req;
  proto::LeaveResponse resp;
  int worker = -1;
  const absl::StatusOr<Admission> admitted =
      AdmitWorkerCall(M::kLeave, *ctx, *raw, &req, &worker,
                      /*generation_checked=*/false);
  absl::Status s = admitted.status();
  if (s.ok()) s = shard_->Leave(req.worker(), req.incarnation());
  resp.set_job_complete(shard_->job_complete());
  return Answer(M::kLeave, ctx, *raw, worker, s, &resp, out);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ShardService::ReadState(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw) {
  proto::ReadStateRequest req;
  AdmissionRequest a;  // a read: any holder of a token, of the job
  absl::Status s = Decode(M::kReadState, *ctx, *raw, &req, &a.caller);
  if (s.ok()) {
    a.job = req.job();
    s = shard_->Admit(a).status();
  }
  if (s.ok() && !read_states_.TryCharge(1)) {
    s = absl::ResourceExhaustedError(absl::StrCat(
        kMaxConcurrentReadStates, " ReadState calls are under way on shard ",
        shard_->options().shard, ": try again when one has ended"));
  }
  // The copies are charged to the server's memory budget before they are
  // made: three while the answer is built (the values kept as they were,
  // the store's export, the messages), one while it streams.
  const int64_t copy = ReadStateBytes(*shard_);
  if (s.ok() && !bn_budget_->TryCharge(3 * copy)) {
    read_states_.Release(1);
    s = absl::ResourceExhaustedError(absl::StrCat(
        "ReadState of shard ", shard_->options().shard, " needs ", 3 * copy,
        " bytes of the server's memory budget while it copies the state; ",
        bn_budget_->left(), " of ", bn_budget_->limit(), " are left",
        3 * copy > bn_budget_->limit()
            ? ": start the server with a larger --bn_memory_budget_mb"
            : ": try again when other calls have ended"));
  }
  if (metrics_) metrics_->Received(M::kReadState, raw->Length());
  if (!s.ok()) {
    LogRejected(*shard_, "ReadState", -1, s);
    if (metrics_) metrics_->Request(M::kReadState, s.code());
    return new Refused<grpc::ServerWriteReactor<grpc::ByteBuffer>>(s);
  }
  std::vector<grpc::ByteBuffer> messages;
  for (const proto::ReadStateResponse& m :
       ReadStateMessages(*shard_, proto::kChunkBytes)) {
    messages.emplace_back();
    SerializeTo(m, &messages.back());
  }
  bn_budget_->Release(2 * copy);
  return NewReadStateReactor(std::move(messages), metrics_, [this, copy] {
    bn_budget_->Release(copy);
    read_states_.Release(1);
  });
}

grpc::ServerUnaryReactor* ShardService::Session(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* out) {
  proto::SessionRequest req;
  proto::SessionResponse resp;
  absl::Status s = ParseRequest(*raw, &req);
  if (s.ok() && sessions_ == nullptr) {
    s = absl::FailedPreconditionError(
        "this server requires no token: its calls need no session");
  }
  if (s.ok()) {
    absl::StatusOr<proto::SessionResponse> r = sessions_->Handle(req);
    s = r.status();
    if (s.ok()) resp = *std::move(r);
  }
  return Answer(M::kSession, ctx, *raw,
                req.has_hello() ? req.hello().worker() : -1, s, &resp, out);
}

}  // namespace bnps::server
