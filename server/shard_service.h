// The gRPC face of a shard: a thin adapter (callback API) that decodes and
// validates each request, calls the Shard's logic, and encodes the answer.
// Waiting (barriers, versions, clocks) never blocks a gRPC thread: the logic
// answers through callbacks, and the reactors finish from there.
//
// Every rejected request gets a clear status and a log line on stderr: bytes
// that do not parse as the request, INVALID_ARGUMENT. A push is checked
// against the store (key, shape, step) at each tensor's first chunk, before
// room is reserved for the size the sender declares. With a job token
// (security/job_token.h), a call that does not prove it (by its session
// without TLS, security/call_session.h; by the token itself over TLS) is
// refused with UNAUTHENTICATED before its request is looked at. The training calls
// (InitParameters, PushGradients, PullParameters, BnSync but BN_RUNNING,
// StartStep, FinishStep) must be of the shard's job generation
// (proto/bnps.proto, "Job generations"), or get ABORTED "... the job rolls
// back ..."; each acts under its Admission (server/admission.h).
// Thread-safety: thread-safe. The Shard must outlive the service.

#ifndef BNPS_SERVER_SHARD_SERVICE_H_
#define BNPS_SERVER_SHARD_SERVICE_H_

#include <string>
#include <utility>

#include "proto/bnps.grpc.pb.h"
#include "server/scratch_pool.h"
#include "server/server_metrics.h"
#include "server/bn_socket_server.h"
#include "security/call_session.h"
#include "security/worker_token.h"
#include "server/shard.h"
#include "util/byte_budget.h"
#include "util/keep_awake.h"

namespace bnps::server {


// Every method uses the callback API, and every one is raw: the service
// parses requests itself, so bytes that do not parse get INVALID_ARGUMENT with
// a message and a log line (gRPC's typed handlers would answer UNIMPLEMENTED,
// with neither). The bulk messages (PushGradients, PullParameters) are framed
// by proto/tensor_wire, so tensors are not copied through protobuf; the other
// messages are parsed and serialized by protobuf's generated classes.
using ShardServiceBase = proto::ParameterServer::WithRawCallbackMethod_Register<
    proto::ParameterServer::WithRawCallbackMethod_Heartbeat<
    proto::ParameterServer::WithRawCallbackMethod_InitParameters<
    proto::ParameterServer::WithRawCallbackMethod_PushGradients<
    proto::ParameterServer::WithRawCallbackMethod_PullParameters<
    proto::ParameterServer::WithRawCallbackMethod_BnSync<
    proto::ParameterServer::WithRawCallbackMethod_StartStep<
    proto::ParameterServer::WithRawCallbackMethod_FinishStep<
    proto::ParameterServer::WithRawCallbackMethod_GetStatus<
    proto::ParameterServer::WithRawCallbackMethod_Rollback<
    proto::ParameterServer::WithRawCallbackMethod_GetDigest<
    proto::ParameterServer::WithRawCallbackMethod_Leave<
    proto::ParameterServer::WithRawCallbackMethod_ReadState<
    proto::ParameterServer::WithRawCallbackMethod_Session<
    proto::ParameterServer::Service>>>>>>>>>>>>>>;  // NOLINT: one per method

class ShardService final : public ShardServiceBase {
 public:
  // `shard` is not owned. An empty `token` accepts calls without one.
  // `metrics` (not owned; null: none) counts and times the calls, and gives
  // GetStatus the per-worker steps and pushes and the BN layers' waits.
  // `keep_awake` (not owned; null: none) is touched by every call and by
  // every authenticated call and by every message of a BN stream
  // (util/keep_awake.h). `bn_socket` (not owned; null: none) is the raw-TCP
  // BN listener, whose port registering workers are told while it listens.
  // `bn_budget` (null: 256 MiB of its own) bounds what the BnSync streams
  // hold in answers their clients have not read, shared with the raw-TCP
  // BN connections. With `per_worker_tokens` (and a token), each worker's own token
  // (security/worker_token.h) is accepted for that worker alone, and a
  // worker has at most one live BnSync stream.
  explicit ShardService(Shard* shard, std::string token = "",
                        ServerMetrics* metrics = nullptr,
                        util::KeepAwake* keep_awake = nullptr,
                        const BnSocketServer* bn_socket = nullptr,
                        bool per_worker_tokens = false,
                        std::shared_ptr<util::ByteBudget> bn_budget = nullptr)
      : shard_(shard),
        auth_(std::move(token), per_worker_tokens,
              shard->options().num_workers),
        metrics_(metrics),
        keep_awake_(keep_awake),
        bn_socket_(bn_socket),
        bn_budget_(bn_budget != nullptr
                       ? std::move(bn_budget)
                       : std::make_shared<util::ByteBudget>(int64_t{256} << 20)) {
    if (auth_.required()) {
      security::SessionTable::Options o;
      o.num_workers = shard->options().num_workers;
      sessions_ = std::make_unique<security::SessionTable>(&auth_, o);
    }
  }

  // ReadState calls served at once; another is RESOURCE_EXHAUSTED.
  static constexpr int kMaxConcurrentReadStates = 2;

  // Requests and responses are the messages of proto/bnps.proto, as bytes.
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* InitParameters(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* req,
                                           grpc::ByteBuffer* resp) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* PushGradients(
      grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* PullParameters(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* BnSync(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* StartStep(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* FinishStep(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Rollback(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* GetDigest(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  // Answers once the shard took the Leave (Shard::Leave); the one that
  // completes the job, after the final checkpoint is written.
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx,
                                  const grpc::ByteBuffer* req,
                                  grpc::ByteBuffer* resp) override;
  // Read-only (server/read_state.h); not generation-checked.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadState(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) override;
  // Opens or confirms a session (security/call_session.h): what calls
  // without TLS carry instead of the token. FAILED_PRECONDITION where no
  // token is required.
  grpc::ServerUnaryReactor* Session(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* req,
                                    grpc::ByteBuffer* resp) override;

  // The staging buffers of pushes, for tests.
  const ScratchPool& scratch() const { return scratch_; }

 private:
  // Who the call of `method` proves the caller is, by its session or (TLS)
  // its token (AuthenticateCall, rpc_util.h): a worker with its own token,
  // or Shard::kAnyWorker; UNAUTHENTICATED otherwise.
  absl::StatusOr<int> Authenticate(ServerMetrics::Method method,
                                   const grpc::CallbackServerContext& ctx) const;
  // Authenticates the call (the caller into `caller`), then parses its
  // request: UNAUTHENTICATED, or INVALID_ARGUMENT for bytes that are not a
  // `Request`, and for no bytes at all where the request must name a worker
  // (`names_worker`): a call cancelled on its way (held up past its deadline
  // by a partition) reaches its handler empty, and would read as one from
  // worker 0 of job ''.
  template <typename Request>
  absl::Status Decode(ServerMetrics::Method method,
                      const grpc::CallbackServerContext& ctx,
                      const grpc::ByteBuffer& raw, Request* req, int* caller,
                      bool names_worker = true) const;
  // Decode, then Shard::Admit as the job and worker the request names (and
  // of the call's generation if `generation_checked`): the guard the
  // handler holds while it acts. `*worker`: the worker the request names
  // once decoded, for the log; -1 before.
  template <typename Request>
  absl::StatusOr<Admission> AdmitWorkerCall(
      ServerMetrics::Method method, const grpc::CallbackServerContext& ctx,
      const grpc::ByteBuffer& raw,
      Request* req, int* worker, bool generation_checked,
      int* caller = nullptr);

  // Respond (rpc_util.h), counting the call in the metrics.
  grpc::ServerUnaryReactor* Answer(
      ServerMetrics::Method method, grpc::CallbackServerContext* ctx,
      const grpc::ByteBuffer& raw, int worker, const absl::Status& s,
      const google::protobuf::MessageLite* resp = nullptr,
      grpc::ByteBuffer* out = nullptr);

  Shard* const shard_;
  const security::TokenAuthenticator auth_;
  // The calls' sessions; null where no token is required.
  std::unique_ptr<security::SessionTable> sessions_;
  ServerMetrics* const metrics_;  // may be null
  util::KeepAwake* const keep_awake_;  // may be null
  const BnSocketServer* const bn_socket_;  // may be null
  const std::shared_ptr<util::ByteBudget> bn_budget_;
  // ReadState calls under way, one unit each: each holds two copies of the
  // shard's state (its snapshot and its messages) until its client has read
  // them, so a token holder's loop of calls is refused past the limit
  // (RESOURCE_EXHAUSTED) instead of growing the server's memory.
  util::ByteBudget read_states_{kMaxConcurrentReadStates};
  // Staging buffers of pushes, reused across calls.
  ScratchPool scratch_{size_t{256} << 20};
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_SHARD_SERVICE_H_
