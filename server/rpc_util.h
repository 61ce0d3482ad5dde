// The shard service's side of the RPC boundary, shared by its unary
// handlers and its reactors (server/shard_service.cc): parsing a raw
// request, finishing a unary call with an absl::Status (converted by
// proto::ToGrpcStatus, the one converter, as the reactors' Finish calls are),
// the one log line per rejected call, and who a call is (its session or,
// over TLS, its job token).
// Internal to server/.
//
// Thread-safety: the functions are thread-safe; a Refused reactor belongs to
// its call.

#ifndef BNPS_SERVER_RPC_UTIL_H_
#define BNPS_SERVER_RPC_UTIL_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/server_context.h"
#include "proto/codec.h"
#include "security/call_session.h"
#include "security/worker_token.h"
#include "server/shard.h"

namespace bnps::server {

// The server's one log line per rejected call, on stderr. The status may
// quote what the client sent (a job name, a key), so all of it is escaped
// (util/log_escape.h): a newline or a byte that is not printable ASCII from
// a client never reaches the log raw. `worker` is -1 when the sender is not
// known (the request did not parse). After a burst of 100, at most five
// lines a second are written (Shard::rejection_log), the next one saying
// how many were left out, so a client that loops on a refused call cannot
// flood the log.
void LogRejected(const Shard& shard, const char* method, int worker,
                 const absl::Status& s);

// The host of a gRPC peer (ServerContext::peer()), for naming where a
// worker's calls come from: "ipv4:10.0.0.4:41234" gives "10.0.0.4",
// "ipv6:[::1]:41234" gives "[::1]" (also with the brackets %-encoded); any
// other form is returned escaped for a log line.
std::string PeerHost(absl::string_view peer);

// Serializes a message protobuf built (which cannot fail) into `out`.
void SerializeTo(const google::protobuf::MessageLite& m,
                 grpc::ByteBuffer* out);

// Parses a unary request from gRPC's bytes (shared, not copied).
// INVALID_ARGUMENT, naming the message, for bytes protobuf does not parse;
// `req` is then cleared, since what was parsed is not to be trusted, not even
// the worker.
template <typename Request>
absl::Status ParseRequest(const grpc::ByteBuffer& raw, Request* req) {
  grpc::ByteBuffer shared(raw);
  grpc::ProtoBufferReader reader(&shared);
  if (!req->ParseFromZeroCopyStream(&reader)) {
    req->Clear();
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message: protobuf could not parse a ",
                     req->GetTypeName()));
  }
  return absl::OkStatus();
}

// Finishes a unary call with `s`, logging a rejection; on success, `resp`
// (if any) is serialized into `out` as the answer.
grpc::ServerUnaryReactor* Respond(
    grpc::CallbackServerContext* ctx, const Shard& shard, const char* method,
    int worker, const absl::Status& s,
    const google::protobuf::MessageLite* resp = nullptr,
    grpc::ByteBuffer* out = nullptr);

// The job token a call carried in its metadata (security/job_token.h), if
// any. The view points into the call's metadata.
std::optional<absl::string_view> CallToken(
    const grpc::CallbackServerContext& ctx);

// Whether the call came over TLS.
bool OverTls(const grpc::CallbackServerContext& ctx);

// Who a call of `method` ("/bnps.proto.ParameterServer/Register") is, as
// security::TokenAuthenticator says: any worker where no token is required;
// else by the session it carries (security/call_session.h; `sessions` may
// be null only where no token is required), or, over TLS only, by the
// token in its metadata. UNAUTHENTICATED otherwise, a token sent without
// TLS included (it crossed the wire in the clear: a client older than the
// server).
absl::StatusOr<int> AuthenticateCall(const grpc::CallbackServerContext& ctx,
                                     absl::string_view method,
                                     const security::TokenAuthenticator& auth,
                                     security::SessionTable* sessions);

// A streaming call refused before its first message: finishes at once with
// `s` (gRPC holds the Finish until the reactor is bound) and deletes itself
// when done.
template <typename Reactor>
class Refused final : public Reactor {
 public:
  explicit Refused(const absl::Status& s) {
    this->Finish(proto::ToGrpcStatus(s));
  }
  void OnDone() override { delete this; }
};

// The job generation a call carried in its metadata (proto/generation.h);
// 0 when it carried none or one that does not parse.
int64_t CallGeneration(const grpc::CallbackServerContext& ctx);

// The earlier of the shard's barrier deadline and the caller's own.
absl::Time WaitDeadline(const Shard& shard,
                        const grpc::CallbackServerContext& ctx);

}  // namespace bnps::server

#endif  // BNPS_SERVER_RPC_UTIL_H_
