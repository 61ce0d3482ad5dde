// BnCalls: the typed calls (each builds its request, sends it through
// BnCall and checks the answer before it decodes it), then the routing of a
// call to a shard's BnTransport.

#include "client/internal/bn_calls.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/internal/bn_socket.h"
#include "client/internal/bn_stream.h"
#include "proto/codec.h"
#include "proto/limits.h"
#include "proto/sharding.h"
#include "util/log_escape.h"

namespace bnps::client::internal {
namespace {

// Close waits at most this long for servers to end the BN streams.
constexpr absl::Duration kCloseGrace = absl::Seconds(1);

// The head of a BN request; BnCall adds the job, the worker and the id.
proto::BnRequest BnHead(const std::string& layer, proto::BnPhase phase,
                        int64_t step = 0) {
  proto::BnRequest head;
  head.set_layer(layer);
  head.set_phase(phase);
  head.set_step(step);
  return head;
}

absl::Status CheckChannels(int64_t got, int64_t want, absl::string_view what) {
  if (got == 0 || got != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " have ", got, " and ", want,
                     " channels; need the same non-zero ", "number"));
  }
  return absl::OkStatus();
}

absl::Status CheckSums(const bn::BackwardSums& s) {
  return CheckChannels(s.sum_dy.size(), s.sum_dy_xhat.size(),
                       "local backward sums: sum_dy and sum_dy_xhat");
}

absl::Status CheckRunning(const bn::RunningStats& r) {
  return CheckChannels(r.mean.size(), r.var.size(),
                       "running stats: mean and var");
}

}  // namespace

absl::Status BnCalls::MalformedBn(const std::string& layer,
                                 const absl::Status& s) const {
  return Malformed(channels_->ShardName(proto::ShardForKey(layer, channels_->num_shards())), s);
}

absl::StatusOr<BnForwardResult> BnCalls::BnForward(const std::string& layer,
                                                    int64_t step,
                                                    const bn::Moments& local,
                                                    bool want_running) {
  if (absl::Status s = bn::ValidateMoments(local); !s.ok()) return s;
  proto::BnRequest request = BnHead(layer, proto::BN_FORWARD, step);
  request.set_want_running(want_running);
  proto::EncodeMoments(local, request.mutable_moments());
  absl::StatusOr<proto::BnResponse> answer = BnCall(std::move(request));
  if (!answer.ok()) return answer.status();
  BnForwardResult result;
  absl::StatusOr<bn::Moments> merged =
      proto::DecodeMoments(answer->moments(), local.channels());
  if (!merged.ok()) return MalformedBn(layer, merged.status());
  result.merged = *std::move(merged);
  if (want_running) {
    absl::StatusOr<bn::RunningStats> running =
        proto::DecodeRunning(answer->running(), local.channels());
    if (!running.ok()) return MalformedBn(layer, running.status());
    result.running = *std::move(running);
  }
  result.contributors = answer->contributors();
  return result;
}

absl::StatusOr<bn::BackwardSums> BnCalls::BnBackward(
    const std::string& layer, int64_t step, const bn::BackwardSums& local) {
  if (absl::Status s = CheckSums(local); !s.ok()) return s;
  proto::BnRequest request = BnHead(layer, proto::BN_BACKWARD, step);
  proto::EncodeSums(local, request.mutable_sums());
  absl::StatusOr<proto::BnResponse> answer = BnCall(std::move(request));
  if (!answer.ok()) return answer.status();
  absl::StatusOr<bn::BackwardSums> sums =
      proto::DecodeSums(answer->sums(), local.sum_dy.size());
  if (!sums.ok()) return MalformedBn(layer, sums.status());
  return sums;
}

absl::Status BnCalls::BnRecal(const std::string& layer, int64_t batch,
                               const bn::Moments& moments) {
  if (absl::Status s = bn::ValidateMoments(moments); !s.ok()) return s;
  proto::BnRequest request = BnHead(layer, proto::BN_RECAL, batch);
  proto::EncodeMoments(moments, request.mutable_moments());
  return BnCall(std::move(request)).status();
}

absl::StatusOr<bn::RunningStats> BnCalls::BnRecalFinish(
    const std::string& layer) {
  return BnCallForRunning(BnHead(layer, proto::BN_RECAL_FINISH), -1);
}

absl::StatusOr<bn::RunningStats> BnCalls::BnLocalRunning(
    const std::string& layer, const bn::RunningStats& running) {
  if (absl::Status s = CheckRunning(running); !s.ok()) return s;
  proto::BnRequest request = BnHead(layer, proto::BN_LOCAL_RUNNING);
  proto::EncodeRunning(running, request.mutable_running());
  return BnCallForRunning(std::move(request), running.mean.size());
}

absl::StatusOr<bn::RunningStats> BnCalls::BnRunning(const std::string& layer,
                                                     int64_t channels) {
  if (channels <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BnRunning: ", channels, " channels"));
  }
  return BnCallForRunning(BnHead(layer, proto::BN_RUNNING), channels);
}

absl::StatusOr<bn::RunningStats> BnCalls::BnCallForRunning(
    proto::BnRequest request, int64_t channels) {
  const std::string layer = request.layer();
  absl::StatusOr<proto::BnResponse> answer = BnCall(std::move(request));
  if (!answer.ok()) return answer.status();
  absl::StatusOr<bn::RunningStats> running =
      proto::DecodeRunning(answer->running(), channels);
  if (!running.ok()) return MalformedBn(layer, running.status());
  return running;
}

std::shared_ptr<BnTransport> BnCalls::GetStream(int shard) {
  std::shared_ptr<BnTransport> old;  // destroyed (drained) after unlocking
  absl::MutexLock lock(&streams_mu_);
  if (closed_) return nullptr;
  std::shared_ptr<BnTransport>& slot = streams_[shard];
  // A stream opened in an earlier generation is refused by the server.
  if (slot == nullptr || slot->broken() ||
      slot->generation() != channels_->generation()) {
    old = std::move(slot);
    slot = OpenBnStream(channels_->shard(shard).channel,
                        channels_->shard(shard).auth->MetadataToken(),
                        channels_->generation(), channels_->options().bn_spin);
  }
  return slot;
}

absl::StatusOr<proto::BnResponse> BnCalls::BnCall(proto::BnRequest request) {
  if (absl::Status s = CheckKey(request.layer(), "BN layer"); !s.ok()) {
    return s;
  }
  request.set_job(channels_->options().job);
  request.set_worker(channels_->options().worker);
  request.clear_id();  // each attempt sets its own
  // The id, set per attempt, adds at most a 1-byte tag and a 10-byte varint.
  constexpr size_t kMaxIdBytes = 11;
  const size_t bytes = request.ByteSizeLong() + kMaxIdBytes;
  if (bytes > static_cast<size_t>(proto::kMaxMessageBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BN request for layer '", request.layer(), "' has ",
                     bytes, " bytes, more than ", proto::kMaxMessageBytes));
  }
  const int shard =
      proto::ShardForKey(request.layer(), channels_->num_shards());
  // Only a failed call names itself: not formatted on every call.
  auto context = [&] {
    return absl::StrCat(proto::BnPhase_Name(request.phase()), " of layer '",
                        request.layer(), "' at step ", request.step(), " on ",
                        channels_->ShardName(shard));
  };
  const absl::Time deadline = absl::Now() + channels_->CallTimeout();
  ChannelAuth& auth = *channels_->shard(shard).auth;
  bool reopened = false;  // the stream's session, once (ChannelAuth::Forget)
  for (int attempt = 0;; ++attempt) {
    // The first attempt over TCP where the shard offers it; a repeat on
    // the stream.
    std::shared_ptr<BnTransport> transport =
        attempt == 0 ? GetSocket(shard) : nullptr;
    uint64_t session = 0;
    BnTransport::Outcome out;
    if (transport == nullptr) {
      // A stream's opening is signed under the channel's session, opened
      // first if there is none (a server that cannot be reached yet is
      // tried again as a broken stream is).
      out.status = auth.Ensure(deadline, &session);
      out.retry = absl::IsUnavailable(out.status);
      if (out.status.ok()) transport = GetStream(shard);
    }
    if (out.status.ok()) {
      if (transport == nullptr) {
        if (absl::Status why = Failed(); !why.ok()) return why;
        return absl::UnavailableError(
            absl::StrCat(context(), ": the client is closed"));
      }
      request.set_id(next_bn_id_.fetch_add(1, std::memory_order_relaxed));
      out = transport->Call(request, deadline);
    }
    if (!out.status.ok()) {
      if (absl::Status why = Failed(); !why.ok()) return why;
      if (!reopened && auth.Forget(session, out.status)) {
        reopened = true;  // the server forgot the session: a new stream
        continue;
      }
      if (out.retry && attempt == 0) {
        const absl::Duration wait =
            std::min(channels_->options().initial_backoff, deadline - absl::Now());
        if (wait >= absl::ZeroDuration()) {
          if (channels_->options().on_retry) {
            channels_->options().on_retry(out.status.code());
          }
          absl::SleepFor(wait);
          continue;
        }
      }
      return Annotate(out.status, context());
    }
    proto::BnResponse& answer = out.response;
    if (answer.code() == 0) return std::move(answer);
    return proto::StatusFromWire(answer.code(), answer.message(), context());
  }
}

BnCalls::BnCalls(Channels* channels)
    : channels_(channels),
      streams_(channels->num_shards()),
      sockets_(channels->num_shards()),
      socket_state_(channels->num_shards()) {}

std::shared_ptr<BnTransport> BnCalls::GetSocket(int shard) {
  const GrpcClientOptions& options = channels_->options();
  const int port = channels_->bn_port(shard);
  if (!options.bn_over_tcp || port <= 0) return nullptr;
  const int64_t generation = channels_->generation();
  std::shared_ptr<BnTransport> old;  // closed after unlocking
  {
    absl::MutexLock lock(&streams_mu_);
    if (closed_) return nullptr;
    std::shared_ptr<BnTransport>& slot = sockets_[shard];
    // A connection of an earlier generation is refused by the server.
    if (slot != nullptr && !slot->broken() &&
        slot->generation() == generation) {
      return slot;
    }
    SocketState& state = socket_state_[shard];
    if (state.connecting || absl::Now() < state.retry_at) return nullptr;
    state.connecting = true;
    old = std::move(slot);
  }
  old.reset();
  proto::BnHello hello;
  hello.set_job(options.job);
  hello.set_worker(options.worker);
  hello.set_generation(generation);
  std::string host = channels_->Host(shard);
  int connect_port = port;
  if (!options.bn_host_aggregator.empty()) {
    // The host's aggregator, told which shard the requests are for.
    hello.set_upstream(absl::StrCat(host, ":", port));
    const size_t colon = options.bn_host_aggregator.rfind(':');
    host = options.bn_host_aggregator.substr(0, colon);
    if (colon == std::string::npos ||
        !absl::SimpleAtoi(options.bn_host_aggregator.substr(colon + 1),
                          &connect_port)) {
      connect_port = 0;  // refused by Connect, reported below
    }
  }
  const absl::Time deadline =
      absl::Now() + std::min(options.rpc_timeout, absl::Seconds(5));
  // A Unix socket first where the shard offers one: it connects only on
  // the shard's host, and fails at once elsewhere.
  const Channels::UnixSocket unix_socket = channels_->bn_unix_socket(shard);
  const std::string& unix_path = unix_socket.path;
  const bool try_unix = options.bn_unix && !unix_path.empty() &&
                        options.bn_host_aggregator.empty();
  bool unix_failed = false;
  std::string unix_failure;
  absl::StatusOr<std::unique_ptr<BnSocket>> opened =
      absl::UnavailableError("not tried");
  if (try_unix) {
    opened = BnSocket::ConnectUnix(unix_path, unix_socket.server_incarnation,
                                   hello, options.token, deadline,
                                   options.bn_spin);
    // Any failure, a refused hello too (it may be another server's), leaves
    // TCP to try.
    if (!opened.ok()) {
      unix_failed = true;
      unix_failure = std::string(opened.status().message());
    }
  }
  const bool over_unix = try_unix && !unix_failed;
  if (!over_unix) {
    opened = BnSocket::Connect(host, connect_port, hello, options.token,
                               deadline, options.bn_spin);
  }
  absl::MutexLock lock(&streams_mu_);
  SocketState& state = socket_state_[shard];
  state.connecting = false;
  if (!opened.ok()) {
    state.retry_at = absl::Now() + kBnSocketRetry;
    const std::string why(opened.status().message());
    if (why != state.said) {
      state.said = why;
      std::fprintf(stderr,
                   "bnps worker %d: BN over %s to %s: %s; its BN traffic "
                   "takes the gRPC stream\n",
                   options.worker, over_unix ? "a Unix socket" : "TCP",
                   channels_->ShardName(shard).c_str(),
                   util::EscapeForLog(why).c_str());  // the server's words
    }
    return nullptr;
  }
  if (closed_) return nullptr;
  const std::string said = over_unix ? "connected: unix" : "connected: tcp";
  if (state.said != said) {
    state.said = said;
    if (over_unix) {
      std::fprintf(stderr, "bnps worker %d: BN over a Unix socket to %s at %s\n",
                   options.worker, channels_->ShardName(shard).c_str(),
                   unix_path.c_str());
    } else {
      const std::string through =
          options.bn_host_aggregator.empty()
              ? ""
              : absl::StrCat(" through ", options.bn_host_aggregator);
      const std::string why_not_unix =
          unix_failed ? absl::StrCat(" (the Unix socket: ",
                                     util::EscapeForLog(unix_failure), ")")
                      : "";
      std::fprintf(stderr, "bnps worker %d: BN over TCP to %s, port %d%s%s\n",
                   options.worker, channels_->ShardName(shard).c_str(), port,
                   through.c_str(), why_not_unix.c_str());
    }
  }
  std::shared_ptr<BnTransport>& slot = sockets_[shard];
  slot = std::shared_ptr<BnTransport>(*std::move(opened));
  return slot;
}

BnCalls::~BnCalls() { Close(); }

std::vector<std::shared_ptr<BnTransport>> BnCalls::TakeTransportsLocked() {
  std::vector<std::shared_ptr<BnTransport>> all;
  for (auto* list : {&sockets_, &streams_}) {
    for (auto& t : *list) {
      if (t != nullptr) all.push_back(std::move(t));
    }
    list->clear();
  }
  closed_ = true;
  return all;
}

absl::Status BnCalls::Failed() {
  absl::MutexLock lock(&streams_mu_);
  return failed_;
}

void BnCalls::FailAll(const absl::Status& why) {
  std::vector<std::shared_ptr<BnTransport>> all;
  {
    absl::MutexLock lock(&streams_mu_);
    if (!failed_.ok() || why.ok()) return;
    failed_ = why;
    all = TakeTransportsLocked();
  }
  for (const auto& t : all) t->Abort(why.message());
  all.clear();  // each drains its calls, which end promptly once aborted
}

void BnCalls::Close() {
  std::vector<std::shared_ptr<BnTransport>> all;
  {
    absl::MutexLock lock(&streams_mu_);
    all = TakeTransportsLocked();
  }
  for (const auto& t : all) t->StartClose();
  const absl::Time deadline =
      absl::Now() + std::min(channels_->options().rpc_timeout, kCloseGrace);
  for (const auto& t : all) t->WaitClosed(deadline);
  for (const auto& t : all) t->Abort("the client was destroyed");
  all.clear();  // each drains its call, which ends promptly once aborted
}

void BnCalls::CancelStuckWrites(absl::Time now) {
  std::vector<std::shared_ptr<BnTransport>> all;
  {
    absl::MutexLock lock(&streams_mu_);
    all = streams_;
    all.insert(all.end(), sockets_.begin(), sockets_.end());
  }
  for (const auto& t : all) {
    if (t != nullptr) t->CancelIfWriteStuck(now);
  }
}

}  // namespace bnps::client::internal
