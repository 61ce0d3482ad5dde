// Test scaffolding for the gRPC client's tests (grpc_ps_client_test,
// bulk_transfer_test, bn_calls_test): FakeShard, a shard server that records
// what it receives and answers predictably (BnMode says how it answers BN),
// and GrpcPsClientTest, a fixture that starts kShards of them on 127.0.0.1.
// Test-only.

#ifndef BNPS_CLIENT_GRPC_PS_CLIENT_TESTING_H_
#define BNPS_CLIENT_GRPC_PS_CLIENT_TESTING_H_

#include "client/grpc_ps_client.h"
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bn/moments.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "gtest/gtest.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/codec.h"
#include "proto/limits.h"
#include "proto/sharding.h"

namespace bnps::client::fakes {


inline constexpr int kShards = 2;
inline constexpr int kWorkers = 2;
inline constexpr char kJob[] = "test-job";

// The first key "<prefix><i>" that ShardForKey puts on `shard`.
inline std::string KeyOnShard(int shard, const std::string& prefix, int skip = 0) {
  for (int i = 0;; ++i) {
    std::string key = absl::StrCat(prefix, i);
    if (proto::ShardForKey(key, kShards) == shard && skip-- == 0) return key;
  }
}

inline Param MakeParam(std::vector<int64_t> shape, float seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Param p;
  p.shape = std::move(shape);
  p.values.resize(n);
  for (int64_t i = 0; i < n; ++i) p.values[i] = seed + 0.001f * (i % 9973);
  return p;
}

inline bool SameParam(const Param& a, const Param& b) {
  return a.shape == b.shape && a.values == b.values;
}

inline bn::Moments MakeMoments(int64_t count, std::vector<double> mean,
                        std::vector<double> m2) {
  bn::Moments m;
  m.count = count;
  m.mean = std::move(mean);
  m.m2 = std::move(m2);
  return m;
}

// How a fake answers BnSync.
enum class BnMode {
  kEcho,             // answer each request at once
  kReverseBatches,   // buffer `bn_batch` requests, answer them in reverse
  kHold,             // read requests, never answer
  kBreakFirst,       // first stream: read one request, end with UNAVAILABLE
  kEndAfterAnswer,   // first stream: answer one request, then end (OK)
  kRefuse,           // end every stream at once with PERMISSION_DENIED
  kIgnoreHalfClose,  // answer; after the client's half-close, stay until
                     // cancelled
  kNoRead,           // never read (flow control fills up)
  kUnreadable,       // answer with a moments field (4) whose contents are
                     // a truncated message: protobuf cannot parse it
};

// A shard server that records what it receives and answers predictably.
class FakeShard final : public proto::ParameterServer::Service {
 public:
  explicit FakeShard(int shard) : shard_(shard) {
    config_.set_job(kJob);
    config_.set_num_workers(kWorkers);
    config_.set_num_shards(kShards);
    config_.set_shard(shard);
    config_.set_policy(proto::POLICY_SYNC);
    config_.set_heartbeat_timeout_ms(10000);
    // No barrier timeout: calls wait rpc_timeout, which the tests set short.
    config_.set_learning_rate(0.1);
  }

  // Knobs, set before the client uses them.
  proto::JobConfig* mutable_config() {
    absl::MutexLock lock(&mu_);
    return &config_;
  }
  void set_bn_mode(BnMode mode, int batch = 1) {
    absl::MutexLock lock(&mu_);
    bn_mode_ = mode;
    bn_batch_ = batch;
  }
  void set_failing_pushes(int n) {
    absl::MutexLock lock(&mu_);
    failing_pushes_ = n;
  }
  // The next n pulls send their first key, then fail with UNAVAILABLE.
  void set_failing_pulls(int n) {
    absl::MutexLock lock(&mu_);
    failing_pulls_ = n;
  }
  std::vector<proto::PullParametersRequest> pull_requests() {
    absl::MutexLock lock(&mu_);
    return pull_requests_;
  }
  // A push with this key fails with INVALID_ARGUMENT (not retried).
  void set_failing_key(const std::string& key) {
    absl::MutexLock lock(&mu_);
    failing_key_ = key;
  }
  // While held, pushes wait before they answer.
  void set_hold_pushes(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_pushes_ = hold;
  }
  // How many pushes wait now (set_hold_pushes).
  int held_pushes() {
    absl::MutexLock lock(&mu_);
    return held_pushes_;
  }
  // While held, pulls wait before they answer (after pull_requests records
  // them).
  void set_hold_pulls(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_pulls_ = hold;
  }
  // What heartbeats are answered with.
  void set_heartbeat_status(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    heartbeat_status_ = std::move(status);
  }
  // The losses heartbeats' answers list (HeartbeatResponse.lost).
  void set_heartbeat_lost(std::vector<proto::WorkerLoss> lost) {
    absl::MutexLock lock(&mu_);
    heartbeat_lost_ = std::move(lost);
  }
  void SetParam(const std::string& key, Param p) {
    absl::MutexLock lock(&mu_);
    params_[key] = std::move(p);
  }

  // Records.
  struct Push {
    int worker = -1;
    int64_t step = -1;
    int64_t num_samples = -1;
    int messages = 0;
    size_t largest_message = 0;
    std::map<std::string, Param> grads;
  };
  std::vector<proto::RegisterRequest> registrations() {
    absl::MutexLock lock(&mu_);
    return registrations_;
  }
  int heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  std::set<uint64_t> heartbeat_incarnations() {
    absl::MutexLock lock(&mu_);
    return heartbeat_incarnations_;
  }
  // The losses the latest heartbeat carried (HeartbeatRequest.losses), and
  // how many heartbeats carried any.
  std::vector<proto::WorkerLoss> last_heartbeat_losses() {
    absl::MutexLock lock(&mu_);
    return last_heartbeat_losses_;
  }
  int heartbeats_with_losses() {
    absl::MutexLock lock(&mu_);
    return heartbeats_with_losses_;
  }
  std::map<std::string, Param> params() {
    absl::MutexLock lock(&mu_);
    return params_;
  }
  std::vector<Push> pushes() {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  int push_calls() {
    absl::MutexLock lock(&mu_);
    return push_calls_;
  }
  std::vector<proto::BnRequest> bn_requests() {
    absl::MutexLock lock(&mu_);
    return bn_requests_;
  }
  int bn_streams() {
    absl::MutexLock lock(&mu_);
    return bn_streams_;
  }
  std::vector<int64_t> started_steps() {
    absl::MutexLock lock(&mu_);
    return started_steps_;
  }
  std::vector<int64_t> finished_clocks() {
    absl::MutexLock lock(&mu_);
    return finished_clocks_;
  }
  bool last_bn_stream_cancelled() {
    absl::MutexLock lock(&mu_);
    return last_bn_stream_cancelled_;
  }
  // Waits (up to 10 s) until some BN stream's handler has returned.
  bool AwaitBnStreamEnded() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        absl::Condition(&bn_stream_ended_), absl::Seconds(10));
  }

  grpc::Status Register(grpc::ServerContext*,
                        const proto::RegisterRequest* request,
                        proto::RegisterResponse* response) override {
    absl::MutexLock lock(&mu_);
    registrations_.push_back(*request);
    *response->mutable_config() = config_;
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*,
                         const proto::HeartbeatRequest* request,
                         proto::HeartbeatResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++heartbeats_;
    heartbeat_incarnations_.insert(request->incarnation());
    last_heartbeat_losses_.assign(request->losses().begin(),
                                  request->losses().end());
    heartbeats_with_losses_ += request->losses_size() > 0;
    for (int w = 0; w < kWorkers; ++w) response->add_live_workers(w);
    for (const proto::WorkerLoss& l : heartbeat_lost_) *response->add_lost() = l;
    return heartbeat_status_;
  }

  grpc::Status InitParameters(
      grpc::ServerContext*, const proto::InitParametersRequest* request,
      proto::InitParametersResponse* response) override {
    absl::MutexLock lock(&mu_);
    for (const proto::NamedTensor& t : request->parameters()) {
      if (proto::ShardForKey(t.key(), kShards) != shard_) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "not my key");
      }
      absl::StatusOr<std::vector<float>> values =
          proto::DecodeFloat32(t.value());
      if (!values.ok()) return proto::ToGrpcStatus(values.status());
      if (params_.count(t.key()) > 0) {
        response->set_already(response->already() + 1);
        continue;
      }
      params_[t.key()] =
          Param{{t.value().shape().begin(), t.value().shape().end()},
                *std::move(values)};
      response->set_initialized(response->initialized() + 1);
    }
    return grpc::Status::OK;
  }

  grpc::Status PushGradients(
      grpc::ServerContext*,
      grpc::ServerReader<proto::PushGradientsRequest>* reader,
      proto::PushGradientsResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      ++push_calls_;
      if (failing_pushes_ > 0) {
        --failing_pushes_;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "try again");
      }
    }
    Push push;
    // Reassembled with the generated classes, independently of the client's
    // own framing (proto/tensor_wire).
    std::map<std::string, int64_t> expected_size;
    proto::PushGradientsRequest message;
    while (reader->Read(&message)) {
      if (message.job() != kJob) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "wrong job");
      }
      if (push.messages > 0 &&
          (message.step() != push.step || message.worker() != push.worker ||
           message.num_samples() != push.num_samples)) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "header changed");
      }
      push.worker = message.worker();
      push.step = message.step();
      push.num_samples = message.num_samples();
      ++push.messages;
      push.largest_message =
          std::max(push.largest_message, message.ByteSizeLong());
      for (const proto::TensorChunk& chunk : message.chunks()) {
        if (proto::ShardForKey(chunk.key(), kShards) != shard_) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "not my key");
        }
        absl::StatusOr<std::vector<float>> part =
            proto::DecodeFloat32(chunk.part());
        if (!part.ok()) return proto::ToGrpcStatus(part.status());
        Param& p = push.grads[chunk.key()];
        if (chunk.offset() != static_cast<int64_t>(p.values.size())) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "chunk out of order");
        }
        p.shape.assign(chunk.shape().begin(), chunk.shape().end());
        p.values.insert(p.values.end(), part->begin(), part->end());
        absl::StatusOr<int64_t> n = proto::NumElements(p.shape);
        if (!n.ok()) return proto::ToGrpcStatus(n.status());
        expected_size[chunk.key()] = *n;
      }
    }
    for (const auto& [key, p] : push.grads) {
      if (static_cast<int64_t>(p.values.size()) != expected_size[key]) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "incomplete tensor");
      }
    }
    response->set_applied(static_cast<int>(push.grads.size()));
    absl::MutexLock lock(&mu_);
    ++held_pushes_;
    mu_.Await(absl::Condition(
        +[](bool* hold) { return !*hold; }, &hold_pushes_));
    --held_pushes_;
    if (push.grads.count(failing_key_) > 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("no parameter ", failing_key_));
    }
    pushes_.push_back(std::move(push));
    return grpc::Status::OK;
  }

  grpc::Status PullParameters(
      grpc::ServerContext*, const proto::PullParametersRequest* request,
      grpc::ServerWriter<proto::PullParametersResponse>* writer) override {
    std::map<std::string, Param> params = this->params();
    std::vector<std::string> keys(request->keys().begin(),
                                  request->keys().end());
    bool fail_after_first = false;
    {
      absl::MutexLock lock(&mu_);
      pull_requests_.push_back(*request);
      mu_.Await(absl::Condition(
          +[](bool* hold) { return !*hold; }, &hold_pulls_));
      if (failing_pulls_ > 0) {
        --failing_pulls_;
        fail_after_first = true;
      }
    }
    if (keys.empty()) {
      for (const auto& [key, p] : params) keys.push_back(key);
    }
    proto::PullParametersResponse response;
    response.set_version(request->min_version());
    for (const std::string& key : keys) {
      auto it = params.find(key);
      if (it == params.end()) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such key " + key);
      }
      google::protobuf::RepeatedPtrField<proto::TensorChunk> chunks;
      proto::AppendChunks(key, it->second.shape, it->second.values,
                          proto::kChunkFloats, &chunks);
      for (proto::TensorChunk& chunk : chunks) {
        *response.add_chunks() = std::move(chunk);
        if (response.chunks_size() == 3) {
          writer->Write(response);
          response.clear_chunks();
        }
      }
      if (fail_after_first) {
        // The first key went out whole; then the server "restarts".
        if (response.chunks_size() > 0) writer->Write(response);
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "going away");
      }
    }
    if (response.chunks_size() > 0) writer->Write(response);
    return grpc::Status::OK;
  }

  grpc::Status BnSync(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<proto::BnResponse, proto::BnRequest>* stream)
      override {
    BnMode mode;
    int batch;
    int index;
    {
      absl::MutexLock lock(&mu_);
      mode = bn_mode_;
      batch = bn_batch_;
      index = bn_streams_++;
    }
    if (mode == BnMode::kRefuse) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not allowed");
    }
    if (mode == BnMode::kNoRead) {
      WaitForCancel(context);
      return grpc::Status::OK;
    }
    std::vector<proto::BnRequest> buffered;
    proto::BnRequest request;
    while (stream->Read(&request)) {
      {
        absl::MutexLock lock(&mu_);
        bn_requests_.push_back(request);
      }
      if (mode == BnMode::kBreakFirst && index == 0) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "going away");
      }
      if (mode == BnMode::kHold) continue;
      if (mode == BnMode::kUnreadable) {
        proto::BnResponse answer = Answer(request);
        // Written verbatim after the real moments; protobuf merges the two
        // and fails on the truncated varint inside.
        answer.GetReflection()->MutableUnknownFields(&answer)->AddLengthDelimited(
            4, "\x08");
        stream->Write(answer);
        continue;
      }
      if (mode == BnMode::kEndAfterAnswer && index == 0) {
        stream->Write(Answer(request));
        return grpc::Status::OK;
      }
      buffered.push_back(request);
      if (mode == BnMode::kReverseBatches &&
          static_cast<int>(buffered.size()) < batch) {
        continue;
      }
      std::reverse(buffered.begin(), buffered.end());
      for (const proto::BnRequest& r : buffered) stream->Write(Answer(r));
      buffered.clear();
    }
    if (mode == BnMode::kIgnoreHalfClose) WaitForCancel(context);
    absl::MutexLock lock(&mu_);
    last_bn_stream_cancelled_ = context->IsCancelled();
    bn_stream_ended_ = true;
    return grpc::Status::OK;
  }

  grpc::Status StartStep(grpc::ServerContext*,
                         const proto::StartStepRequest* request,
                         proto::StartStepResponse*) override {
    absl::MutexLock lock(&mu_);
    started_steps_.push_back(request->step());
    return grpc::Status::OK;
  }

  grpc::Status FinishStep(grpc::ServerContext*,
                          const proto::FinishStepRequest* request,
                          proto::FinishStepResponse*) override {
    absl::MutexLock lock(&mu_);
    finished_clocks_.push_back(request->completed());
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext*, const proto::StatusRequest*,
                         proto::StatusResponse* response) override {
    absl::MutexLock lock(&mu_);
    *response->mutable_config() = config_;
    response->set_num_parameters(static_cast<int>(params_.size()));
    return grpc::Status::OK;
  }

 private:
  static void WaitForCancel(grpc::ServerContext* context) {
    const absl::Time give_up = absl::Now() + absl::Seconds(15);
    while (!context->IsCancelled() && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  // Forward: count * 2, mean + 1, m2 * 2, and when asked running (mean, 1);
  // backward: sums * 2; recal finish and running: fixed stats; local running:
  // stats / 2. A layer named "fail..." gets FAILED_PRECONDITION.
  static proto::BnResponse Answer(const proto::BnRequest& r) {
    proto::BnResponse out;
    out.set_id(r.id());
    if (r.layer().rfind("fail", 0) == 0) {
      out.set_code(static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
      out.set_message("layer is not ready");
      return out;
    }
    out.set_contributors(kWorkers);
    switch (r.phase()) {
      case proto::BN_FORWARD: {
        bn::Moments m = *proto::DecodeMoments(r.moments());
        bn::RunningStats running = bn::RunningStats::Initial(m.channels());
        m.count *= 2;
        for (double& v : m.mean) v += 1;
        for (double& v : m.m2) v *= 2;
        running.mean = m.mean;
        proto::EncodeMoments(m, out.mutable_moments());
        if (r.want_running()) {
          proto::EncodeRunning(running, out.mutable_running());
        }
        break;
      }
      case proto::BN_BACKWARD: {
        bn::BackwardSums s = *proto::DecodeSums(r.sums());
        for (double& v : s.sum_dy) v *= 2;
        for (double& v : s.sum_dy_xhat) v *= 2;
        proto::EncodeSums(s, out.mutable_sums());
        break;
      }
      case proto::BN_RECAL:
        break;
      case proto::BN_RECAL_FINISH:
        proto::EncodeRunning(bn::RunningStats{{1, 2}, {3, 4}},
                             out.mutable_running());
        break;
      case proto::BN_RUNNING:
        proto::EncodeRunning(bn::RunningStats{{5, 6}, {7, 8}},
                             out.mutable_running());
        break;
      case proto::BN_LOCAL_RUNNING: {
        bn::RunningStats s = *proto::DecodeRunning(r.running());
        for (double& v : s.mean) v /= 2;
        for (double& v : s.var) v /= 2;
        proto::EncodeRunning(s, out.mutable_running());
        break;
      }
      default:
        out.set_code(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
        out.set_message("bad phase");
    }
    return out;
  }

  const int shard_;
  absl::Mutex mu_;
  proto::JobConfig config_ ABSL_GUARDED_BY(mu_);
  BnMode bn_mode_ ABSL_GUARDED_BY(mu_) = BnMode::kEcho;
  int bn_batch_ ABSL_GUARDED_BY(mu_) = 1;
  int failing_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int failing_pulls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<proto::PullParametersRequest> pull_requests_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Param> params_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::RegisterRequest> registrations_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<uint64_t> heartbeat_incarnations_ ABSL_GUARDED_BY(mu_);
  grpc::Status heartbeat_status_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::WorkerLoss> heartbeat_lost_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::WorkerLoss> last_heartbeat_losses_ ABSL_GUARDED_BY(mu_);
  int heartbeats_with_losses_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Push> pushes_ ABSL_GUARDED_BY(mu_);
  int push_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::string failing_key_ ABSL_GUARDED_BY(mu_);
  bool hold_pushes_ ABSL_GUARDED_BY(mu_) = false;
  int held_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  bool hold_pulls_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<proto::BnRequest> bn_requests_ ABSL_GUARDED_BY(mu_);
  int bn_streams_ ABSL_GUARDED_BY(mu_) = 0;
  bool last_bn_stream_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool bn_stream_ended_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int64_t> started_steps_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> finished_clocks_ ABSL_GUARDED_BY(mu_);
};

class GrpcPsClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < kShards; ++i) {
      fakes_.push_back(std::make_unique<FakeShard>(i));
      grpc::ServerBuilder builder;
      int port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                               &port);
      builder.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
      builder.SetMaxSendMessageSize(proto::kMaxMessageBytes);
      builder.RegisterService(fakes_.back().get());
      servers_.push_back(builder.BuildAndStart());
      ASSERT_NE(servers_.back(), nullptr);
      ASSERT_GT(port, 0);
      addresses_.push_back(absl::StrCat("127.0.0.1:", port));
    }
  }

  void TearDown() override {
    for (auto& server : servers_) {
      server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    }
  }

  GrpcClientOptions Options(int worker = 1) const {
    GrpcClientOptions options;
    options.servers = addresses_;
    options.job = kJob;
    options.worker = worker;
    options.num_workers = kWorkers;
    options.rpc_timeout = absl::Seconds(5);
    options.initial_backoff = absl::Milliseconds(10);
    return options;
  }

  std::unique_ptr<GrpcPsClient> Connect(GrpcClientOptions options) {
    absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
        GrpcPsClient::Connect(std::move(options));
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::vector<std::unique_ptr<FakeShard>> fakes_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<std::string> addresses_;
};

}  // namespace bnps::client::fakes

#endif  // BNPS_CLIENT_GRPC_PS_CLIENT_TESTING_H_
