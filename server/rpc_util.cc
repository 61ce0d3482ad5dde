#include "server/rpc_util.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "proto/generation.h"

#include <algorithm>
#include <cstdio>

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

std::optional<absl::string_view> CallToken(
    const grpc::CallbackServerContext& ctx) {
  const auto& metadata = ctx.client_metadata();
  const auto it = metadata.find(grpc::string_ref(
      security::kTokenMetadataKey.data(), security::kTokenMetadataKey.size()));
  if (it == metadata.end()) return std::nullopt;
  return absl::string_view(it->second.data(), it->second.size());
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
