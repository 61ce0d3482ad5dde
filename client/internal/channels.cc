#include "client/internal/channels.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/limits.h"
#include "grpcpp/security/credentials.h"

namespace bnps::client::internal {
namespace {

// Backoffs between attempts double up to this, and channels reconnect at
// most this long after a failed connection attempt (gRPC's default is 120
// s, far too long for a restarted shard): a link that heals is used again
// within about a second, well inside the servers' heartbeat timeout (3 s
// at the least a test sets), so a short cut costs no worker.
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);
constexpr int kMaxReconnectBackoffMs = 1000;
// The bulk methods' full names, for raw calls (proto/bnps.proto).
constexpr char kPushMethod[] = "/bnps.proto.ParameterServer/PushGradients";
constexpr char kPullMethod[] = "/bnps.proto.ParameterServer/PullParameters";

}  // namespace

absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

absl::Status Malformed(absl::string_view from, const absl::Status& s) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed response from ", from, ": ", s.message()));
}

absl::Status CheckKey(const std::string& key, absl::string_view what) {
  if (key.empty() || key.size() > static_cast<size_t>(proto::kMaxKeyBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", key, "' must have 1 to ", proto::kMaxKeyBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status RunParallel(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  threads.reserve(n > 0 ? n - 1 : 0);
  for (int i = 1; i < n; ++i) {
    threads.emplace_back([&results, &fn, i] { results[i] = fn(i); });
  }
  if (n > 0) results[0] = fn(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string Channels::Host(int shard) const {
  std::string address = shards_[shard].address;
  if (const size_t scheme = address.find(":///"); scheme != std::string::npos) {
    address = address.substr(scheme + 4);
  }
  return address.substr(0, address.rfind(':'));
}

Channels::UnixSocket Channels::bn_unix_socket(int shard) const {
  absl::MutexLock lock(&paths_mu_);
  return bn_unix_sockets_[shard];
}

void Channels::set_bn_unix_socket(int shard, UnixSocket socket) {
  absl::MutexLock lock(&paths_mu_);
  bn_unix_sockets_[shard] = std::move(socket);
}

Channels::Channels(GrpcClientOptions options)
    : options_(std::move(options)),
      shards_(options_.servers.size()),
      bn_ports_(new std::atomic<int>[options_.servers.size()]),
      bn_unix_sockets_(options_.servers.size()) {
  for (size_t i = 0; i < shards_.size(); ++i) bn_ports_[i].store(0);
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(proto::kMaxMessageBytes);
  args.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  const int reconnect_ms = static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(options_.initial_backoff),
                          20, kMaxReconnectBackoffMs));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, reconnect_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  const bool tls = options_.credentials != nullptr;
  for (size_t i = 0; i < shards_.size(); ++i) {
    Shard& s = shards_[i];
    s.address = options_.servers[i];
    s.auth = std::make_unique<ChannelAuth>(
        ChannelAuth::Identity{options_.job, options_.worker, options_.token,
                              tls},
        ShardName(static_cast<int>(i)));
    s.channel = s.auth->Connect(
        s.address,
        tls ? options_.credentials : grpc::InsecureChannelCredentials(), args);
    s.stub = proto::ParameterServer::NewStub(s.channel);
    s.push_method = std::make_unique<grpc::internal::RpcMethod>(
        kPushMethod, grpc::internal::RpcMethod::CLIENT_STREAMING, s.channel);
    s.pull_method = std::make_unique<grpc::internal::RpcMethod>(
        kPullMethod, grpc::internal::RpcMethod::SERVER_STREAMING, s.channel);
  }
}

std::string Channels::ShardName(int shard) const {
  return absl::StrCat("shard ", shard, " (", shards_[shard].address, ")");
}

void Channels::SetUp(grpc::ClientContext* context, absl::Time deadline) const {
  context->set_deadline(absl::ToChronoTime(deadline));
  context->AddMetadata(proto::kGenerationMetadataKey,
                       absl::StrCat(generation_.load()));
}

absl::Duration Channels::CallTimeout() const {
  // 0 (proto3's unset) means the server did not say.
  if (config_.barrier_timeout_ms() <= 0) return options_.rpc_timeout;
  return std::max(options_.rpc_timeout,
                  absl::Milliseconds(config_.barrier_timeout_ms()) +
                      absl::Seconds(5));
}

void Channels::Abort(absl::Status why) {
  absl::MutexLock lock(&calls_mu_);
  if (!aborted_.ok() || why.ok()) return;
  aborted_ = std::move(why);
  for (grpc::ClientContext* context : calls_) context->TryCancel();
}

absl::Status Channels::aborted() const {
  absl::MutexLock lock(&calls_mu_);
  return aborted_;
}

bool Channels::Register(grpc::ClientContext* context) {
  absl::MutexLock lock(&calls_mu_);
  if (!aborted_.ok()) return false;
  calls_.insert(context);
  return true;
}

void Channels::Unregister(grpc::ClientContext* context) {
  absl::MutexLock lock(&calls_mu_);
  calls_.erase(context);
}

void Channels::SleepUnlessAborted(absl::Duration d) {
  absl::MutexLock lock(&calls_mu_);
  calls_mu_.AwaitWithTimeout(
      absl::Condition(
          +[](absl::Status* aborted) { return !aborted->ok(); }, &aborted_),
      d);
}

absl::Duration Channels::Backoff(int retry) {
  absl::Duration d = options_.initial_backoff;
  for (int i = 0; i < retry && d < kMaxBackoff; ++i) d *= 2;
  d = std::min(d, kMaxBackoff);
  absl::MutexLock lock(&rng_mu_);
  return d * absl::Uniform(rng_, 0.8, 1.2);
}

}  // namespace bnps::client::internal
