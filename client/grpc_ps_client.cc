#include "client/grpc_ps_client.h"

#include "grpcpp/security/credentials.h"

#include <cstdio>

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/internal/bn_calls.h"
#include "client/internal/bulk_transfer.h"
#include "client/internal/channels.h"
#include "client/internal/membership.h"
#include "client/internal/streaming_pull.h"
#include "client/internal/streaming_push.h"
#include "client/internal/task_threads.h"
#include "proto/membership_history.h"
#include "security/job_token.h"

namespace bnps::client {
namespace {

// How often the background thread looks for BN writes stuck past their
// deadline.
constexpr absl::Duration kWatchdogTick = absl::Milliseconds(100);

// call() (a BN call of `layer`), timed for options.on_bn_call where that is
// set and the call got its answer; untimed otherwise.
template <typename Call>
auto ObservedBnCall(const GrpcClientOptions& options, const std::string& layer,
                    bool backward, Call call) {
  const auto& observe = options.on_bn_call;
  if (!observe) return call();
  const absl::Time start = absl::Now();
  auto result = call();
  if (result.ok()) observe(layer, backward, absl::Now() - start);
  return result;
}

}  // namespace

absl::Status ValidateOptions(const GrpcClientOptions& options) {
  if (options.servers.empty()) {
    return absl::InvalidArgumentError("GrpcClientOptions.servers is empty");
  }
  for (size_t i = 0; i < options.servers.size(); ++i) {
    if (options.servers[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GrpcClientOptions.servers[", i, "] is empty"));
    }
  }
  if (options.job.empty()) {
    return absl::InvalidArgumentError("GrpcClientOptions.job is empty");
  }
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GrpcClientOptions.num_workers is ", options.num_workers,
                     "; need at least 1"));
  }
  if (options.worker < 0 || options.worker >= options.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GrpcClientOptions.worker is ", options.worker,
        "; need 0 <= worker < num_workers = ", options.num_workers));
  }
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.connect_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "GrpcClientOptions.connect_timeout must be finite and positive");
  }
  if (options.rpc_timeout <= absl::ZeroDuration() ||
      options.rpc_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "GrpcClientOptions.rpc_timeout must be finite and positive");
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        "GrpcClientOptions.max_attempts must be at least 1");
  }
  if (!options.bn_host_aggregator.empty()) {
    const std::string& a = options.bn_host_aggregator;
    const size_t colon = a.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(a.substr(colon + 1), &port) || port < 1 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GrpcClientOptions.bn_host_aggregator is '", a,
          "'; need host:port (the host's bnps_host_bn)"));
    }
  }
  if (options.initial_backoff < absl::ZeroDuration() ||
      options.initial_backoff == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "GrpcClientOptions.initial_backoff must be finite and non-negative");
  }
  if (options.push_part_bytes < 0) {
    return absl::InvalidArgumentError(
        "GrpcClientOptions.push_part_bytes must be non-negative");
  }
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_interval == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "GrpcClientOptions.heartbeat_interval must be finite and positive");
  }
  if (options.bn_spin < absl::ZeroDuration() ||
      options.bn_spin > absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        "GrpcClientOptions.bn_spin must be in [0, 1 s]");
  }
  if (!options.token.empty()) {
    if (absl::Status s = security::ValidateToken(options.token); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GrpcClientOptions.token: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GrpcPsClient>> GrpcPsClient::Connect(
    GrpcClientOptions options) {
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  // Null credentials: plaintext (Channels decides from them).
  if (options.credentials != nullptr) {
    options.bn_over_tcp = false;  // BN statistics stay encrypted
  }
  std::unique_ptr<GrpcPsClient> client =
      absl::WrapUnique(new GrpcPsClient(std::move(options)));
  absl::StatusOr<proto::JobConfig> config =
      client->membership_->Register(deadline);
  if (!config.ok()) return config.status();
  client->channels_->set_config(*std::move(config));
  client->background_ =
      std::thread(&GrpcPsClient::BackgroundLoop, client.get());
  return client;
}

GrpcPsClient::GrpcPsClient(GrpcClientOptions options)
    : channels_(std::make_unique<internal::Channels>(std::move(options))),
      membership_(std::make_unique<internal::Membership>(channels_.get())),
      bulk_(std::make_unique<internal::BulkTransfer>(channels_.get())),
      bn_(std::make_unique<internal::BnCalls>(channels_.get())),
      pull_threads_(
          std::make_unique<internal::TaskThreads>(channels_->num_shards())) {}

GrpcPsClient::~GrpcPsClient() {
  {
    absl::MutexLock lock(&bg_mu_);
    stopping_ = true;
  }
  membership_->Stop();  // cancels a heartbeat in flight
  if (background_.joinable()) background_.join();
  bn_->Close();
}

void GrpcPsClient::BackgroundLoop() {
  const absl::Duration interval = channels_->options().heartbeat_interval;
  absl::Time next_heartbeat = absl::Now() + interval;
  while (true) {
    {
      absl::MutexLock lock(&bg_mu_);
      bg_mu_.AwaitWithDeadline(
          absl::Condition(&stopping_),
          std::min(next_heartbeat, absl::Now() + kWatchdogTick));
      if (stopping_) return;
    }
    const absl::Time now = absl::Now();
    bn_->CancelStuckWrites(now);
    if (now >= next_heartbeat) {
      membership_->SendHeartbeats();
      // Dropped: the calls under way end now, with why (a barrier at a
      // shard this process cannot reach would wait out its deadline).
      if (absl::Status dropped = membership_->dropped(); !dropped.ok()) {
        bn_->FailAll(dropped);
        channels_->Abort(dropped);
      }
      next_heartbeat += interval;
      if (next_heartbeat < absl::Now()) next_heartbeat = absl::Now() + interval;
    }
  }
}

const proto::JobConfig& GrpcPsClient::config() const {
  return channels_->config();
}
int GrpcPsClient::worker() const { return channels_->options().worker; }
int GrpcPsClient::num_workers() const {
  return channels_->options().num_workers;
}
const GrpcClientOptions& GrpcPsClient::options() const {
  return channels_->options();
}
int GrpcPsClient::num_shards() const { return channels_->num_shards(); }

absl::Status GrpcPsClient::InitParameters(const Params& params) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return bulk_->InitParameters(params);
}

absl::Status GrpcPsClient::PushGradients(int64_t step, int64_t num_samples,
                                         const Params& grads) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return bulk_->PushGradients(step, num_samples, grads);
}

absl::Status GrpcPsClient::PushGradients(int64_t step, int64_t num_samples,
                                         std::shared_ptr<const Params> grads) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return bulk_->PushGradients(step, num_samples, std::move(grads));
}

std::unique_ptr<GradientPush> GrpcPsClient::StartPush(int64_t step,
                                                      int64_t num_samples) {
  return std::make_unique<internal::StreamingPush>(
      bulk_.get(), step, num_samples, channels_->options().push_part_bytes,
      membership_->dropped());
}

absl::Status GrpcPsClient::PullParametersInto(int64_t min_version,
                                              Params* params) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return bulk_->PullParametersInto(min_version, params);
}

std::unique_ptr<ParameterPull> GrpcPsClient::StartPull(
    int64_t min_version, const std::vector<std::string>& keys, Params* into) {
  return std::make_unique<internal::StreamingPull>(
      channels_.get(), pull_threads_.get(), min_version, keys, into,
      membership_->dropped());
}

absl::StatusOr<Params> GrpcPsClient::PullParameters(
    const std::vector<std::string>& keys, int64_t min_version) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return bulk_->PullParameters(keys, min_version);
}

absl::StatusOr<BnForwardResult> GrpcPsClient::BnForward(
    const std::string& layer, int64_t step, const bn::Moments& local,
    bool want_running) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return ObservedBnCall(channels_->options(), layer, /*backward=*/false, [&] {
    return bn_->BnForward(layer, step, local, want_running);
  });
}

absl::StatusOr<bn::BackwardSums> GrpcPsClient::BnBackward(
    const std::string& layer, int64_t step, const bn::BackwardSums& local) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return ObservedBnCall(channels_->options(), layer, /*backward=*/true,
                        [&] { return bn_->BnBackward(layer, step, local); });
}

absl::Status GrpcPsClient::BnRecal(const std::string& layer, int64_t batch,
                                   const bn::Moments& moments) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return bn_->BnRecal(layer, batch, moments);
}

absl::StatusOr<bn::RunningStats> GrpcPsClient::BnRecalFinish(
    const std::string& layer) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return bn_->BnRecalFinish(layer);
}

absl::StatusOr<bn::RunningStats> GrpcPsClient::BnLocalRunning(
    const std::string& layer, const bn::RunningStats& running) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return bn_->BnLocalRunning(layer, running);
}

absl::StatusOr<bn::RunningStats> GrpcPsClient::BnRunning(
    const std::string& layer, int64_t channels) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return bn_->BnRunning(layer, channels);
}

absl::StatusOr<int64_t> GrpcPsClient::StartStep(int64_t step) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return membership_->StartStep(step);
}

absl::Status GrpcPsClient::FinishStep(int64_t completed) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  return membership_->FinishStep(completed);
}

std::vector<int> GrpcPsClient::LiveWorkers() const {
  return membership_->stats().live_workers;
}

absl::StatusOr<int64_t> GrpcPsClient::Recover(bool restarted) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  const absl::Time deadline =
      absl::Now() + channels_->options().connect_timeout + channels_->CallTimeout();
  absl::StatusOr<int64_t> step = membership_->Recover(restarted, deadline);
  if (step.ok()) {
    std::fprintf(stderr,
                 "bnps worker %d: the job rolled back to step %lld "
                 "(generation %lld)\n",
                 channels_->options().worker, static_cast<long long>(*step),
                 static_cast<long long>(channels_->generation()));
  }
  return step;
}

bool GrpcPsClient::rejoining() const { return membership_->rejoining(); }

google::protobuf::RepeatedPtrField<proto::MembershipSegment>
GrpcPsClient::membership() const {
  return membership_->job_membership();
}

absl::StatusOr<int64_t> GrpcPsClient::Join() {
  return Resize(/*grow=*/true);
}

absl::StatusOr<int64_t> GrpcPsClient::LeaveEarly() {
  return Resize(/*grow=*/false);
}

absl::StatusOr<int64_t> GrpcPsClient::Resize(bool grow) {
  if (absl::Status s = membership_->dropped(); !s.ok()) return s;
  const absl::Time deadline =
      absl::Now() + channels_->options().connect_timeout + channels_->CallTimeout();
  const int worker = channels_->options().worker;
  absl::StatusOr<int64_t> step = membership_->Recover(
      /*restarted=*/false, deadline, grow ? worker + 1 : 0, grow ? 0 : worker);
  if (step.ok()) {
    absl::StatusOr<proto::MembershipHistory> h =
        proto::MembershipHistory::FromSegments(channels_->options().num_workers,
                                               membership_->job_membership());
    std::fprintf(stderr,
                 "bnps worker %d: asked to %s: the job rolled back "
                 "(generation %lld); membership %s\n",
                 worker, grow ? "join" : "leave early",
                 static_cast<long long>(channels_->generation()),
                 h.ok() ? h->ToString().c_str()
                        : std::string(h.status().message()).c_str());
  }
  return step;
}

absl::Status GrpcPsClient::Leave() { return membership_->Leave(); }

absl::StatusOr<proto::StatusResponse> GrpcPsClient::GetStatus(int shard) {
  return membership_->GetStatus(shard);
}

HeartbeatStats GrpcPsClient::heartbeat_stats() const {
  return membership_->stats();
}

}  // namespace bnps::client
