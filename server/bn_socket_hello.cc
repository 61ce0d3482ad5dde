// BnSocketServer's hello (server/bn_socket_server.h): the handshake
// (security/bn_handshake.h) and the admission of a connection's worker(s).
// The listener and the frames are in bn_socket_server.cc.

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/bn_frame.h"
#include "proto/bnps.pb.h"
#include "security/bn_handshake.h"
#include "security/job_token.h"
#include "server/bn_socket_conn.h"
#include "server/bn_socket_server.h"
#include "server/rpc_util.h"

namespace bnps::server {
namespace {

using Conn = BnSocketServer::Conn;

// The workers a hello's connection speaks for: several for a host's
// aggregator (hostbn/aggregator.h), each checked, and only with the job
// token (`caller` any worker); else `*workers` stays the hello's one.
absl::Status HelloWorkers(Shard& shard, const proto::BnHello& hello,
                          int caller, std::vector<int>* workers) {
  if (hello.workers_size() == 0) return absl::OkStatus();
  if (caller != Shard::kAnyWorker) {
    return absl::PermissionDeniedError(absl::StrCat(
        "a BN connection speaking for several workers (a host's "
        "aggregator) needs the job token; worker ", caller,
        "'s own token acts as that worker alone"));
  }
  workers->assign(hello.workers().begin(), hello.workers().end());
  for (int w : *workers) {
    AdmissionRequest a;
    a.caller = caller;
    a.job = hello.job();
    a.worker = w;
    if (absl::Status s = shard.Admit(a).status(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void Send(Conn& conn, const proto::BnHelloReply& reply) {
  std::string out;
  if (proto::AppendFrame(reply, &out).ok()) conn.Write(out);
}

// Sends `*reply` carrying `s`'s code and message.
void Reply(Conn& conn, const absl::Status& s, proto::BnHelloReply* reply) {
  reply->set_code(static_cast<int>(s.code()));
  reply->set_message(std::string(s.message()));
  Send(conn, *reply);
}

}  // namespace

size_t BnSocketServer::MaxHelloBytes(const std::string& job, int num_workers) {
  proto::BnHello largest;
  // A host's aggregator names every worker it speaks for (at most all).
  for (int i = 0; i < num_workers; ++i) {
    largest.add_workers(std::numeric_limits<int32_t>::min());
  }
  largest.set_job(job);
  largest.set_worker(std::numeric_limits<int32_t>::min());  // 10 bytes
  largest.set_generation(std::numeric_limits<int64_t>::min());
  largest.set_client_nonce(std::string(security::kHelloNonceBytes, 'n'));
  // No token is sent; an older client's, up to the longest, is admitted
  // to be refused with a reason rather than cut off.
  largest.set_token(std::string(security::kMaxTokenBytes, '~'));
  return largest.ByteSizeLong();
}

bool BnSocketServer::HandleHello(const std::shared_ptr<Conn>& c,
                                 absl::string_view bytes) {
  Conn& conn = *c;
  auto refuse = [&](const absl::Status& s, int worker) {
    proto::BnHelloReply reply;
    Reply(conn, s, &reply);
    LogRejected(*shard_, "BnSync (TCP)", worker, s);
    return false;
  };
  if (conn.handshake.has_value() && conn.handshake->awaiting_proof()) {
    // The second frame: the client's proof.
    proto::BnHelloProof proof;
    if (!proof.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return refuse(absl::InvalidArgumentError(
                        "the frame after the challenge is no BnHelloProof"), -1);
    }
    absl::StatusOr<int> who = conn.handshake->Finish(proof);
    conn.handshake.reset();
    if (!who.ok()) return refuse(who.status(), -1);
    return AdmitHello(c, conn.hello, *who);
  }
  if (!conn.hello.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return refuse(absl::InvalidArgumentError("the first frame is no BnHello"), -1);
  }
  conn.handshake.emplace(auth_.get(), conn.transport);
  absl::StatusOr<proto::BnHelloReply> first = conn.handshake->Begin(conn.hello);
  if (!first.ok()) return refuse(first.status(), -1);
  if (conn.handshake->awaiting_proof()) {
    Send(conn, *first);  // the challenge: nothing is admitted before the proof
    return true;
  }
  conn.handshake.reset();
  return AdmitHello(c, conn.hello, Shard::kAnyWorker);  // a job without a token
}

bool BnSocketServer::AdmitHello(const std::shared_ptr<Conn>& c,
                                const proto::BnHello& hello, int caller) {
  Conn& conn = *c;
  AdmissionRequest a;
  a.caller = caller;
  a.job = hello.job();
  a.worker = hello.worker();
  a.connection = BnTransport::kTcp;
  a.connection_generation = hello.generation();
  absl::StatusOr<Admission> admitted =
      authenticated_ >= max_connections_
          ? absl::ResourceExhaustedError(absl::StrCat(
                "the server holds ", authenticated_,
                " BN connections, its cap: try again later"))
          : shard_->Admit(a);
  absl::Status s = admitted.status();
  if (s.ok()) conn.admission = *std::move(admitted);
  std::vector<int> workers = {hello.worker()};
  if (s.ok()) s = HelloWorkers(*shard_, hello, caller, &workers);
  proto::BnHelloReply reply;
  reply.set_server_incarnation(shard_->server_incarnation());
  Reply(conn, s, &reply);
  if (!s.ok()) {
    const bool known = s.code() != absl::StatusCode::kUnauthenticated;
    LogRejected(*shard_, "BnSync (TCP)", known ? hello.worker() : -1, s);
    return false;
  }
  if (keep_awake_ != nullptr) keep_awake_->Touch();
  LeavePending(conn);
  ++authenticated_;
  Conn* raw = c.get();  // the dispatcher is conn's: it never outlives it
  // The connection acts as the worker its hello named, whatever its token.
  conn.dispatcher.emplace(shard_, metrics_, hello.generation(), workers,
                          [raw](int64_t bytes) { return raw->Admit(bytes); });
  return true;
}

}  // namespace bnps::server
