#include "server/rpc_util.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "proto/generation.h"

#include <algorithm>
#include <cstdio>

#include "grpc/grpc_security_constants.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "security/job_token.h"
#include "util/log_escape.h"

namespace bnps::server {

void LogRejected(const Shard& shard, const char* method, int worker,
                 const absl::Status& s) {
  int64_t left_out = 0;
  if (!shard.rejection_log().Admit(absl::Now(), &left_out)) return;
  std::fprintf(stderr, "bnps_server[%d]: %s from worker %d rejected: %s%s\n",
               shard.options().shard, method, worker,
               util::EscapeForLog(s.ToString()).c_str(),
               util::LogLimiter::LeftOut(left_out).c_str());
}

std::string PeerHost(absl::string_view peer) {
  std::string text(peer);
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (!absl::ConsumePrefix(&peer, scheme)) continue;
    const size_t colon = peer.rfind(':');
    if (colon == absl::string_view::npos || colon == 0) break;
    std::string host(peer.substr(0, colon));
    if (absl::StartsWith(host, "%5B") && absl::EndsWith(host, "%5D")) {
      host = absl::StrCat("[", host.substr(3, host.size() - 6), "]");
    }
    text = host;
    break;
  }
  return util::EscapeForLog(text);
}

void SerializeTo(const google::protobuf::MessageLite& m,
                 grpc::ByteBuffer* out) {
  bool own_buffer;
  grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(
      m, out, &own_buffer);
}

grpc::ServerUnaryReactor* Respond(grpc::CallbackServerContext* ctx,
                                  const Shard& shard, const char* method,
                                  int worker, const absl::Status& s,
                                  const google::protobuf::MessageLite* resp,
                                  grpc::ByteBuffer* out) {
  if (!s.ok()) {
    LogRejected(shard, method, worker, s);
  } else if (resp != nullptr) {
    SerializeTo(*resp, out);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(proto::ToGrpcStatus(s));
  return reactor;
}


bool OverTls(const grpc::CallbackServerContext& ctx) {
  const std::shared_ptr<const grpc::AuthContext> a = ctx.auth_context();
  if (a == nullptr) return false;
  for (const grpc::string_ref& v :
       a->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME)) {
    if (v == GRPC_SSL_TRANSPORT_SECURITY_TYPE) return true;
  }
  return false;
}

namespace {

// The value of metadata `key`, if the call has it.
std::optional<absl::string_view> Metadata(const grpc::CallbackServerContext& ctx,
                                          absl::string_view key) {
  const auto& metadata = ctx.client_metadata();
  const auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return std::nullopt;
  return absl::string_view(it->second.data(), it->second.size());
}

}  // namespace

absl::StatusOr<int> AuthenticateCall(const grpc::CallbackServerContext& ctx,
                                     absl::string_view method,
                                     const security::TokenAuthenticator& auth,
                                     security::SessionTable* sessions) {
  if (!auth.required()) return security::TokenAuthenticator::kAnyWorker;
  if (std::optional<absl::string_view> session =
          Metadata(ctx, security::kCallAuthMetadataKey)) {
    return sessions->Verify(
        *session, method,
        Metadata(ctx, proto::kGenerationMetadataKey).value_or(""));
  }
  std::optional<absl::string_view> token = CallToken(ctx);
  if (token.has_value() && !OverTls(ctx)) {
    return absl::UnauthenticatedError(
        "a call without TLS carries no token (it crossed the wire in the "
        "clear): this client is older than the server; upgrade it, and "
        "consider the token seen");
  }
  if (!token.has_value()) {
    return absl::UnauthenticatedError(
        "the call carries neither a session nor a token: this job requires "
        "one (--token_file)");
  }
  return auth.Authenticate(token);
}

std::optional<absl::string_view> CallToken(
    const grpc::CallbackServerContext& ctx) {
  return Metadata(ctx, security::kTokenMetadataKey);
}

int64_t CallGeneration(const grpc::CallbackServerContext& ctx) {
  const auto& metadata = ctx.client_metadata();
  const auto it = metadata.find(grpc::string_ref(proto::kGenerationMetadataKey));
  int64_t g = 0;
  if (it == metadata.end() ||
      !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()),
                        &g)) {
    return 0;
  }
  return g;
}

absl::Time WaitDeadline(const Shard& shard,
                        const grpc::CallbackServerContext& ctx) {
  return std::min(shard.Deadline(), absl::FromChrono(ctx.deadline()));
}

}  // namespace bnps::server
