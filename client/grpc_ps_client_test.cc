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
#include "gmock/gmock.h"
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

namespace bnps::client {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

constexpr int kShards = 2;
constexpr int kWorkers = 2;
constexpr char kJob[] = "test-job";

// The first key "<prefix><i>" that ShardForKey puts on `shard`.
std::string KeyOnShard(int shard, const std::string& prefix, int skip = 0) {
  for (int i = 0;; ++i) {
    std::string key = absl::StrCat(prefix, i);
    if (proto::ShardForKey(key, kShards) == shard && skip-- == 0) return key;
  }
}

Param MakeParam(std::vector<int64_t> shape, float seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Param p;
  p.shape = std::move(shape);
  p.values.resize(n);
  for (int64_t i = 0; i < n; ++i) p.values[i] = seed + 0.001f * (i % 9973);
  return p;
}

bool SameParam(const Param& a, const Param& b) {
  return a.shape == b.shape && a.values == b.values;
}

bn::Moments MakeMoments(int64_t count, std::vector<double> mean,
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
  // What heartbeats are answered with.
  void set_heartbeat_status(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    heartbeat_status_ = std::move(status);
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
    for (int w = 0; w < kWorkers; ++w) response->add_live_workers(w);
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
    mu_.Await(absl::Condition(
        +[](bool* hold) { return !*hold; }, &hold_pushes_));
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
  std::vector<Push> pushes_ ABSL_GUARDED_BY(mu_);
  int push_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::string failing_key_ ABSL_GUARDED_BY(mu_);
  bool hold_pushes_ ABSL_GUARDED_BY(mu_) = false;
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

TEST_F(GrpcPsClientTest, ConnectRegistersWithEveryShard) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options(/*worker=*/1));
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->num_shards(), kShards);
  EXPECT_EQ(client->config().policy(), proto::POLICY_SYNC);
  EXPECT_EQ(client->config().num_workers(), kWorkers);
  for (int i = 0; i < kShards; ++i) {
    std::vector<proto::RegisterRequest> regs = fakes_[i]->registrations();
    ASSERT_EQ(regs.size(), 1u) << "shard " << i;
    EXPECT_EQ(regs[0].job(), kJob);
    EXPECT_EQ(regs[0].worker(), 1);
    EXPECT_EQ(regs[0].num_workers(), kWorkers);
    EXPECT_EQ(regs[0].num_shards(), kShards);
  }
}

TEST_F(GrpcPsClientTest, ConnectRejectsBadOptions) {
  GrpcClientOptions options = Options();
  options.servers.clear();
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.worker = kWorkers;
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.worker = -1;
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.job.clear();
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.max_attempts = 0;
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.rpc_timeout = absl::ZeroDuration();
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.push_part_bytes = -1;
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.bn_spin = absl::Microseconds(-1);
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, ConnectRejectsWorkerCountMismatch) {
  fakes_[1]->mutable_config()->set_num_workers(3);
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Connect(Options());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(client.status().message(), HasSubstr("shard 1"));
}

// A refused Connect registers nowhere: checking happens before joining.
void ExpectNoRegistrations(
    const std::vector<std::unique_ptr<FakeShard>>& fakes) {
  for (size_t i = 0; i < fakes.size(); ++i) {
    EXPECT_TRUE(fakes[i]->registrations().empty()) << "shard " << i;
  }
}

TEST_F(GrpcPsClientTest, ConnectRejectsServersOutOfOrder) {
  GrpcClientOptions options = Options();
  std::swap(options.servers[0], options.servers[1]);
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client = GrpcPsClient::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(client.status().message(), HasSubstr("shard order"));
  ExpectNoRegistrations(fakes_);
}

TEST_F(GrpcPsClientTest, ConnectRejectsShardsThatDisagree) {
  fakes_[1]->mutable_config()->set_policy(proto::POLICY_ASYNC);
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Connect(Options());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(client.status().message(), HasSubstr("policy"));
  ExpectNoRegistrations(fakes_);
}

TEST_F(GrpcPsClientTest, CheckConfigRunsBeforeRegistering) {
  GrpcClientOptions options = Options();
  std::vector<proto::JobConfig> seen;
  options.check_config = [&](const proto::JobConfig& c) {
    seen.push_back(c);
    return c.policy() == proto::POLICY_ASYNC
               ? absl::OkStatus()
               : absl::FailedPreconditionError("launched for async");
  };
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Connect(options);
  EXPECT_EQ(client.status(),
            absl::FailedPreconditionError("launched for async"));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].policy(), proto::POLICY_SYNC);
  ExpectNoRegistrations(fakes_);
  for (auto& fake : fakes_) {
    fake->mutable_config()->set_policy(proto::POLICY_ASYNC);
  }
  client = GrpcPsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(fakes_[0]->registrations().size(), 1u);
  EXPECT_EQ(fakes_[1]->registrations().size(), 1u);
}

TEST_F(GrpcPsClientTest, EachClientIsAnIncarnationOfItsOwn) {
  GrpcClientOptions options = Options();
  options.heartbeat_interval = absl::Milliseconds(20);
  std::unique_ptr<GrpcPsClient> first = Connect(options);
  ASSERT_NE(first, nullptr);
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while ((fakes_[0]->heartbeats() == 0 || fakes_[1]->heartbeats() == 0) &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  first.reset();
  std::unique_ptr<GrpcPsClient> second = Connect(options);
  ASSERT_NE(second, nullptr);
  const std::vector<proto::RegisterRequest> regs = fakes_[0]->registrations();
  ASSERT_EQ(regs.size(), 2u);
  EXPECT_NE(regs[0].incarnation(), 0u);
  EXPECT_NE(regs[1].incarnation(), 0u);
  EXPECT_NE(regs[0].incarnation(), regs[1].incarnation());
  // One process uses one incarnation with every shard and in its heartbeats.
  EXPECT_EQ(fakes_[1]->registrations()[0].incarnation(), regs[0].incarnation());
  EXPECT_EQ(fakes_[0]->heartbeat_incarnations().count(regs[0].incarnation()),
            1u);
  EXPECT_EQ(fakes_[1]->heartbeat_incarnations().count(regs[0].incarnation()),
            1u);
}

TEST_F(GrpcPsClientTest, ADroppedWorkerStopsAtOnce) {
  GrpcClientOptions options = Options();
  options.heartbeat_interval = absl::Milliseconds(20);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::map<std::string, Param> grads = {
      {KeyOnShard(1, "w"), MakeParam({2}, 1)}};
  ASSERT_TRUE(client->PushGradients(0, 1, grads).ok());
  fakes_[1]->set_heartbeat_status(grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      "worker 1 was lost (no heartbeat for 10s): the job dropped it"));
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (client->heartbeat_stats().dropped.ok() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Status dropped = client->heartbeat_stats().dropped;
  EXPECT_EQ(dropped.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(dropped.message(), HasSubstr("was lost"));
  EXPECT_THAT(dropped.message(), HasSubstr("shard 1"));
  // Nothing more reaches the servers: the process is to stop.
  EXPECT_EQ(client->PushGradients(1, 1, grads), dropped);
  std::unique_ptr<GradientPush> push = client->StartPush(1, 1);
  push->Add(std::make_shared<const Params>(grads));
  EXPECT_EQ(push->Finish(), dropped);
  EXPECT_EQ(client->PullParameters(0).status(), dropped);
  EXPECT_EQ(client->FinishStep(1), dropped);
  EXPECT_EQ(client->BnForward(KeyOnShard(0, "bn"), 1, MakeMoments(2, {1}, {1}))
                .status(),
            dropped);
  EXPECT_EQ(fakes_[1]->pushes().size(), 1u);
  EXPECT_TRUE(fakes_[0]->finished_clocks().empty());
}

TEST_F(GrpcPsClientTest, ConnectRejectsMissingShardCount) {
  GrpcClientOptions options = Options();
  options.servers.pop_back();  // the servers run a 2-shard job
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client = GrpcPsClient::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(GrpcPsClientTest, ConnectToDeadPortFailsWithinConnectTimeout) {
  // A bound socket that does not listen: connections are refused, and nobody
  // else can take the port meanwhile.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  GrpcClientOptions options = Options();
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  options.servers = {address};
  // Connect gives up after connect_timeout, however long calls may take.
  options.connect_timeout = absl::Milliseconds(500);
  options.rpc_timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client = GrpcPsClient::Connect(options);
  const absl::Duration took = absl::Now() - start;
  close(fd);
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(client.status().code() == absl::StatusCode::kUnavailable ||
              client.status().code() == absl::StatusCode::kDeadlineExceeded)
      << client.status();
  EXPECT_THAT(client.status().message(), HasSubstr(address));
  EXPECT_THAT(client.status().message(), HasSubstr("connect_timeout"));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST_F(GrpcPsClientTest, ConnectRetriesUntilAShardComesUp) {
  // Shard 1's address refuses connections for a while (a server still
  // starting); Connect keeps trying with backoff and succeeds once it
  // listens.
  const std::string late = addresses_[1];
  servers_[1]->Shutdown(absl::ToChronoTime(absl::Now()));
  servers_[1]->Wait();
  std::unique_ptr<grpc::Server> restarted;
  std::thread restart([this, late, &restarted] {
    absl::SleepFor(absl::Milliseconds(700));
    grpc::ServerBuilder builder;
    builder.AddListeningPort(late, grpc::InsecureServerCredentials());
    builder.RegisterService(fakes_[1].get());
    restarted = builder.BuildAndStart();
  });
  GrpcClientOptions options = Options();
  options.connect_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Connect(options);
  restart.join();
  ASSERT_NE(restarted, nullptr) << "could not listen on " << late << " again";
  servers_[1] = std::move(restarted);
  EXPECT_TRUE(client.ok()) << client.status();
}

TEST_F(GrpcPsClientTest, ConnectRejectsBadConnectTimeout) {
  GrpcClientOptions options = Options();
  options.connect_timeout = absl::ZeroDuration();
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.connect_timeout = absl::InfiniteDuration();
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, InitParametersRoutesKeysToTheirShards) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  std::map<std::string, Param> params;
  for (int i = 0; i < 10; ++i) {
    params[absl::StrCat("layer", i, ".weight")] = MakeParam({3, i + 1}, i);
  }
  // Larger than half a message: the client splits a shard's keys over calls.
  params[KeyOnShard(0, "big")] = MakeParam({1500000}, 7);
  params[KeyOnShard(0, "big", 1)] = MakeParam({1500000}, 8);
  ASSERT_TRUE(client->InitParameters(params).ok());
  for (int s = 0; s < kShards; ++s) {
    std::map<std::string, Param> got = fakes_[s]->params();
    for (const auto& [key, p] : params) {
      if (proto::ShardForKey(key, kShards) == s) {
        ASSERT_EQ(got.count(key), 1u) << key;
        EXPECT_TRUE(SameParam(got[key], p)) << key;
      } else {
        EXPECT_EQ(got.count(key), 0u) << key << " on shard " << s;
      }
    }
  }
  // Too large for one message: refused before anything is sent.
  std::map<std::string, Param> huge;
  huge["huge"] = MakeParam({3000000}, 1);
  EXPECT_EQ(client->InitParameters(huge).code(),
            absl::StatusCode::kInvalidArgument);
  // A shape that does not match the values.
  std::map<std::string, Param> bad;
  bad["bad"] = Param{{2, 2}, {1, 2, 3}};
  EXPECT_EQ(client->InitParameters(bad).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, PushGradientsRoutesAndChunks) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options(/*worker=*/1));
  ASSERT_NE(client, nullptr);
  std::map<std::string, Param> grads;
  for (int i = 0; i < 8; ++i) {
    grads[absl::StrCat("conv", i, ".weight")] = MakeParam({4, 3, 3, 3}, i);
  }
  const std::string big = KeyOnShard(1, "fc.weight");
  grads[big] = MakeParam({3000, 1000}, 0.5f);  // 3M floats: 12 chunks
  grads[KeyOnShard(0, "empty")] = MakeParam({0, 5}, 0);
  ASSERT_TRUE(
      client->PushGradients(/*step=*/7, /*num_samples=*/32, grads).ok());

  for (int s = 0; s < kShards; ++s) {
    std::vector<FakeShard::Push> pushes = fakes_[s]->pushes();
    ASSERT_EQ(pushes.size(), 1u) << "shard " << s;
    const FakeShard::Push& push = pushes[0];
    EXPECT_EQ(push.worker, 1);
    EXPECT_EQ(push.step, 7);
    EXPECT_EQ(push.num_samples, 32);
    EXPECT_LE(push.largest_message,
              static_cast<size_t>(proto::kBulkMessageBytes));
    std::vector<std::string> want;
    for (const auto& [key, p] : grads) {
      if (proto::ShardForKey(key, kShards) != s) continue;
      want.push_back(key);
      ASSERT_EQ(push.grads.count(key), 1u) << key;
      EXPECT_TRUE(SameParam(push.grads.at(key), p)) << key;
    }
    std::vector<std::string> got;
    for (const auto& [key, p] : push.grads) got.push_back(key);
    EXPECT_THAT(got, UnorderedElementsAreArray(want));
    if (s == 1) {
      EXPECT_GE(push.messages, 12);  // 12 chunks of 1 MB, one per message
    }
  }
  EXPECT_EQ(client->PushGradients(-1, 1, grads).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, PushGradientsRetriesUnavailable) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  fakes_[0]->set_failing_pushes(1);
  std::map<std::string, Param> grads;
  const std::string key = KeyOnShard(0, "w");
  grads[key] = MakeParam({100}, 1);
  ASSERT_TRUE(client->PushGradients(3, 8, grads).ok());
  EXPECT_EQ(fakes_[0]->push_calls(), 2);
  ASSERT_EQ(fakes_[0]->pushes().size(), 1u);
  EXPECT_TRUE(SameParam(fakes_[0]->pushes()[0].grads.at(key), grads[key]));
  EXPECT_EQ(fakes_[1]->push_calls(), 0);  // it owns none of the keys

  // More failures than attempts: the last status comes back.
  fakes_[0]->set_failing_pushes(100);
  GrpcClientOptions options = Options();
  options.max_attempts = 3;
  std::atomic<int> retries{0};
  options.on_retry = [&retries](absl::StatusCode code) {
    EXPECT_EQ(code, absl::StatusCode::kUnavailable);
    ++retries;
  };
  std::unique_ptr<GrpcPsClient> impatient = Connect(options);
  ASSERT_NE(impatient, nullptr);
  const int before = fakes_[0]->push_calls();
  absl::Status s = impatient->PushGradients(4, 8, grads);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("shard 0"));
  EXPECT_EQ(fakes_[0]->push_calls() - before, 3);
  EXPECT_EQ(retries.load(), 2);  // between the three attempts
}

// StartPush: Add hands a part over and returns while the shards still hold
// it; Finish waits for the answers. Every key arrives once, intact, with the
// step's number and sample count.
TEST_F(GrpcPsClientTest, PushInPartsReturnsFromAddWhileTheShardsHoldIt) {
  GrpcClientOptions options = Options(/*worker=*/1);
  options.push_part_bytes = 0;  // every part as it comes
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  auto a = std::make_shared<Params>();
  auto b = std::make_shared<Params>();
  for (int s = 0; s < kShards; ++s) {
    (*a)[KeyOnShard(s, "a")] = MakeParam({3, 4}, s);
    (*b)[KeyOnShard(s, "b")] = MakeParam({5}, 10 + s);
  }
  (*b)[KeyOnShard(1, "fc")] = MakeParam({3000, 1000}, 0.5f);  // chunked
  for (auto& fake : fakes_) fake->set_hold_pushes(true);
  std::unique_ptr<GradientPush> push =
      client->StartPush(/*step=*/5, /*num_samples=*/16);
  push->Add(a);
  push->Add(b);
  // Both Adds returned with every push held: none waited for an answer. The
  // first part is on its way before Finish.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (fakes_[0]->push_calls() + fakes_[1]->push_calls() == 0 &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GT(fakes_[0]->push_calls() + fakes_[1]->push_calls(), 0);
  for (auto& fake : fakes_) fake->set_hold_pushes(false);
  ASSERT_TRUE(push->Finish().ok());

  Params want = *a;
  want.insert(b->begin(), b->end());
  Params got;
  for (int s = 0; s < kShards; ++s) {
    for (const FakeShard::Push& p : fakes_[s]->pushes()) {
      EXPECT_EQ(p.worker, 1);
      EXPECT_EQ(p.step, 5);
      EXPECT_EQ(p.num_samples, 16);
      for (const auto& [key, g] : p.grads) {
        EXPECT_TRUE(got.emplace(key, g).second) << key << " came twice";
      }
    }
  }
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, g] : want) {
    ASSERT_EQ(got.count(key), 1u) << key;
    EXPECT_TRUE(SameParam(got.at(key), g)) << key;
  }
}

// A part that fails does not stop the others: Finish returns its error
// once every other part was answered.
TEST_F(GrpcPsClientTest, PushInPartsReportsAFailedPartAfterTheRest) {
  GrpcClientOptions options = Options(/*worker=*/1);
  options.push_part_bytes = 0;
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const std::string bad = KeyOnShard(0, "bad");
  fakes_[0]->set_failing_key(bad);
  auto first = std::make_shared<Params>();
  (*first)[KeyOnShard(1, "first")] = MakeParam({7}, 1);
  auto failing = std::make_shared<Params>();
  (*failing)[bad] = MakeParam({7}, 2);
  auto last = std::make_shared<Params>();
  (*last)[KeyOnShard(1, "last")] = MakeParam({7}, 3);
  std::unique_ptr<GradientPush> push = client->StartPush(6, 8);
  push->Add(first);
  push->Add(failing);
  push->Add(last);
  const absl::Status s = push->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("PushGradients of step 6 to shard 0"));
  EXPECT_THAT(s.message(), HasSubstr("no parameter " + bad));
  std::set<std::string> on_shard_1;
  for (const FakeShard::Push& p : fakes_[1]->pushes()) {
    for (const auto& [key, g] : p.grads) on_shard_1.insert(key);
  }
  EXPECT_EQ(on_shard_1, (std::set<std::string>{first->begin()->first,
                                               last->begin()->first}));
  EXPECT_TRUE(fakes_[0]->pushes().empty());
  // Bad arguments come back from Finish as well.
  std::unique_ptr<GradientPush> negative = client->StartPush(-1, 8);
  negative->Add(first);
  EXPECT_EQ(negative->Finish().code(), absl::StatusCode::kInvalidArgument);
}

// Parts smaller than push_part_bytes wait for more: small ones go together
// in Finish, one call per shard; once enough bytes are in they are sent.
TEST_F(GrpcPsClientTest, PushInPartsSendsOnceEnoughBytesAreIn) {
  GrpcClientOptions options = Options(/*worker=*/1);
  options.push_part_bytes = 4000;
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::unique_ptr<GradientPush> push = client->StartPush(2, 4);
  for (int i = 0; i < 3; ++i) {
    auto part = std::make_shared<Params>();
    (*part)[KeyOnShard(1, "small", i)] = MakeParam({100}, i);  // 400 bytes
    push->Add(part);
  }
  ASSERT_TRUE(push->Finish().ok());
  EXPECT_EQ(fakes_[1]->push_calls(), 1);
  ASSERT_EQ(fakes_[1]->pushes().size(), 1u);
  EXPECT_EQ(fakes_[1]->pushes()[0].grads.size(), 3u);

  fakes_[1]->set_hold_pushes(true);
  push = client->StartPush(3, 4);
  auto big = std::make_shared<Params>();
  (*big)[KeyOnShard(1, "big")] = MakeParam({1000}, 1);  // 4000 bytes
  push->Add(big);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (fakes_[1]->push_calls() < 2 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(fakes_[1]->push_calls(), 2);  // sent before Finish
  fakes_[1]->set_hold_pushes(false);
  ASSERT_TRUE(push->Finish().ok());
  EXPECT_EQ(fakes_[1]->pushes().size(), 2u);
}

// A push abandoned (its step failed mid-pass) sends nothing more: parts
// still held are dropped, so the shards see none of them.
TEST_F(GrpcPsClientTest, AnAbandonedPushSendsWhatItHeldNowhere) {
  GrpcClientOptions options = Options(/*worker=*/1);
  options.push_part_bytes = 4000;
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::unique_ptr<GradientPush> push = client->StartPush(2, 4);
  auto part = std::make_shared<Params>();
  (*part)[KeyOnShard(1, "small")] = MakeParam({100}, 1);  // under 4000 bytes
  push->Add(part);
  push->Abandon();
  push.reset();  // and the destructor sends nothing either
  EXPECT_EQ(fakes_[1]->push_calls(), 0);
  // A push dropped without Finish or Abandon is abandoned too.
  push = client->StartPush(3, 4);
  push->Add(part);
  push.reset();
  EXPECT_EQ(fakes_[1]->push_calls(), 0);
  // The client goes on: the next push is delivered.
  push = client->StartPush(4, 4);
  push->Add(part);
  ASSERT_TRUE(push->Finish().ok());
  EXPECT_EQ(fakes_[1]->push_calls(), 1);
}

TEST_F(GrpcPsClientTest, PullParametersReassemblesEveryShard) {
  std::map<std::string, Param> want;
  want[KeyOnShard(0, "a")] = MakeParam({2, 3}, 1);
  want[KeyOnShard(1, "b")] = MakeParam({5}, 2);
  want[KeyOnShard(1, "big")] = MakeParam({3, 1000, 1000}, 3);  // 3M floats
  want[KeyOnShard(0, "c")] = MakeParam({7, 1}, 4);
  for (const auto& [key, p] : want) {
    fakes_[proto::ShardForKey(key, kShards)]->SetParam(key, p);
  }
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::map<std::string, Param>> got = client->PullParameters(0);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want.size());
  for (const auto& [key, p] : want) {
    ASSERT_EQ(got->count(key), 1u) << key;
    EXPECT_TRUE(SameParam(got->at(key), p)) << key;
  }

  const std::vector<std::string> keys = {KeyOnShard(1, "b"), KeyOnShard(0, "c"),
                                         KeyOnShard(1, "b")};
  got = client->PullParameters(keys, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_TRUE(SameParam(got->at(keys[0]), want[keys[0]]));
  EXPECT_TRUE(SameParam(got->at(keys[1]), want[keys[1]]));

  EXPECT_EQ(client->PullParameters({"nope"}, 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(client->PullParameters(std::vector<std::string>{}, 0)->empty());

  // Into existing entries: the buffers are reused, the values replaced.
  std::map<std::string, Param> into;
  into[KeyOnShard(1, "big")] = MakeParam({3, 1000, 1000}, 9);
  into[KeyOnShard(0, "a")];
  const float* big_buffer = into[KeyOnShard(1, "big")].values.data();
  ASSERT_TRUE(client->PullParametersInto(0, &into).ok());
  ASSERT_EQ(into.size(), 2u);
  EXPECT_EQ(into[KeyOnShard(1, "big")].values.data(), big_buffer);
  EXPECT_TRUE(SameParam(into[KeyOnShard(1, "big")], want[KeyOnShard(1, "big")]));
  EXPECT_TRUE(SameParam(into[KeyOnShard(0, "a")], want[KeyOnShard(0, "a")]));
  into[KeyOnShard(0, "nope")];
  EXPECT_EQ(client->PullParametersInto(0, &into).code(),
            absl::StatusCode::kNotFound);
}

// The fake servers answer as servers that predate in_order: the pull
// still brings every key, into the caller's buffers (reused), each Wait
// returning once its key is in.
TEST_F(GrpcPsClientTest, StartPullFillsTheCallersEntries) {
  std::map<std::string, Param> want;
  want[KeyOnShard(1, "big")] = MakeParam({3, 1000, 1000}, 3);  // 3M floats
  want[KeyOnShard(0, "a")] = MakeParam({2, 3}, 1);
  want[KeyOnShard(1, "b")] = MakeParam({5}, 2);
  for (const auto& [key, p] : want) {
    fakes_[proto::ShardForKey(key, kShards)]->SetParam(key, p);
  }
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> order = {
      KeyOnShard(1, "b"), KeyOnShard(0, "a"), KeyOnShard(1, "big")};
  std::map<std::string, Param> into;
  into[KeyOnShard(1, "big")] = MakeParam({3, 1000, 1000}, 9);
  into["stale"] = MakeParam({1}, 9);  // not asked for: dropped
  const float* big_buffer = into[KeyOnShard(1, "big")].values.data();
  std::unique_ptr<ParameterPull> pull = client->StartPull(0, order, &into);
  ASSERT_EQ(into.size(), 3u);
  for (const std::string& key : order) {
    ASSERT_TRUE(pull->Wait(key).ok()) << key;
    EXPECT_TRUE(SameParam(into[key], want[key])) << key;
  }
  ASSERT_TRUE(pull->Finish().ok());
  EXPECT_EQ(into[KeyOnShard(1, "big")].values.data(), big_buffer);

  pull = client->StartPull(0, {KeyOnShard(0, "a"), KeyOnShard(0, "nope")},
                           &into);
  EXPECT_EQ(pull->Wait(KeyOnShard(0, "nope")).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pull->Finish().code(), absl::StatusCode::kNotFound);
}

// A streaming pull whose call fails after its first key is retried for the
// keys not yet in only: the entry a caller may already be reading is not
// written again.
TEST_F(GrpcPsClientTest, StartPullRetriesOnlyTheKeysNotYetIn) {
  const std::string a = KeyOnShard(0, "a"), b = KeyOnShard(0, "b"),
                    c = KeyOnShard(0, "c");
  fakes_[0]->SetParam(a, MakeParam({4}, 1));
  fakes_[0]->SetParam(b, MakeParam({5}, 2));
  fakes_[0]->SetParam(c, MakeParam({6}, 3));
  fakes_[0]->set_failing_pulls(1);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  std::map<std::string, Param> into;
  std::unique_ptr<ParameterPull> pull = client->StartPull(3, {b, a, c}, &into);
  ASSERT_TRUE(pull->Wait(b).ok());
  const float* b_buffer = into[b].values.data();
  ASSERT_TRUE(pull->Finish().ok());
  EXPECT_TRUE(SameParam(into[a], MakeParam({4}, 1)));
  EXPECT_TRUE(SameParam(into[b], MakeParam({5}, 2)));
  EXPECT_TRUE(SameParam(into[c], MakeParam({6}, 3)));
  EXPECT_EQ(into[b].values.data(), b_buffer);
  const std::vector<proto::PullParametersRequest> calls =
      fakes_[0]->pull_requests();
  ASSERT_EQ(calls.size(), 2u);
  for (const proto::PullParametersRequest& r : calls) {
    EXPECT_TRUE(r.in_order());
    EXPECT_EQ(r.min_version(), 3);
  }
  EXPECT_EQ(std::vector<std::string>(calls[0].keys().begin(),
                                     calls[0].keys().end()),
            (std::vector<std::string>{b, a, c}));
  EXPECT_EQ(std::vector<std::string>(calls[1].keys().begin(),
                                     calls[1].keys().end()),
            (std::vector<std::string>{a, c}));
}

TEST_F(GrpcPsClientTest, BnExchangesRoundTrip) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options(/*worker=*/1));
  ASSERT_NE(client, nullptr);
  const bn::Moments local = MakeMoments(10, {1.0, -2.0, 3.5}, {4.0, 5.0, 6.0});
  absl::StatusOr<BnForwardResult> fwd = client->BnForward("bn1", 4, local);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->merged.count, 20);
  EXPECT_EQ(fwd->merged.mean, (std::vector<double>{2.0, -1.0, 4.5}));
  EXPECT_EQ(fwd->merged.m2, (std::vector<double>{8.0, 10.0, 12.0}));
  EXPECT_FALSE(fwd->running.has_value());  // not asked for
  EXPECT_EQ(fwd->contributors, kWorkers);
  fwd = client->BnForward("bn1", 5, local, /*want_running=*/true);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  ASSERT_TRUE(fwd->running.has_value());
  EXPECT_EQ(fwd->running->mean, fwd->merged.mean);
  EXPECT_EQ(fwd->running->var, (std::vector<double>(3, 1.0)));

  bn::BackwardSums sums{{1.0, 2.0, 3.0}, {-1.0, 0.5, 0.0}};
  absl::StatusOr<bn::BackwardSums> back = client->BnBackward("bn1", 4, sums);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sum_dy, (std::vector<double>{2.0, 4.0, 6.0}));
  EXPECT_EQ(back->sum_dy_xhat, (std::vector<double>{-2.0, 1.0, 0.0}));

  EXPECT_TRUE(client->BnRecal("bn2", 0, local).ok());
  absl::StatusOr<bn::RunningStats> pop = client->BnRecalFinish("bn2");
  ASSERT_TRUE(pop.ok()) << pop.status();
  EXPECT_EQ(pop->mean, (std::vector<double>{1, 2}));
  EXPECT_EQ(pop->var, (std::vector<double>{3, 4}));
  absl::StatusOr<bn::RunningStats> avg =
      client->BnLocalRunning("bn3", bn::RunningStats{{2, 4}, {6, 8}});
  ASSERT_TRUE(avg.ok()) << avg.status();
  EXPECT_EQ(avg->mean, (std::vector<double>{1, 2}));
  absl::StatusOr<bn::RunningStats> now = client->BnRunning("bn4", 2);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->mean, (std::vector<double>{5, 6}));
  EXPECT_EQ(now->var, (std::vector<double>{7, 8}));
  // Stats of the wrong width are a malformed answer.
  EXPECT_EQ(client->BnRunning("bn4", 3).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Each request went to the shard that owns its layer, with job and worker,
  // and ids never repeat on a stream.
  for (int s = 0; s < kShards; ++s) {
    std::set<uint64_t> ids;
    for (const proto::BnRequest& r : fakes_[s]->bn_requests()) {
      EXPECT_EQ(proto::ShardForKey(r.layer(), kShards), s) << r.layer();
      EXPECT_EQ(r.job(), kJob);
      EXPECT_EQ(r.worker(), 1);
      EXPECT_TRUE(ids.insert(r.id()).second) << "repeated id " << r.id();
      if (r.phase() == proto::BN_FORWARD) {
        EXPECT_EQ(r.want_running(), r.step() == 5) << r.step();
      }
    }
  }
  // Invalid local values are refused before anything is sent.
  EXPECT_EQ(client->BnForward("bn1", 5, bn::Moments{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      client->BnBackward("bn1", 5, bn::BackwardSums{{1}, {}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->BnForward("", 5, local).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->BnRunning("bn4", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, ConcurrentBnCallersGetTheirOwnResponses) {
  // Shard 0 answers in batches of 4, in reverse order of arrival.
  fakes_[0]->set_bn_mode(BnMode::kReverseBatches, 4);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  constexpr int kThreads = 6;  // 4 on shard 0, 2 on shard 1
  constexpr int kRounds = 25;
  std::vector<std::string> layers;
  for (int t = 0; t < 4; ++t) layers.push_back(KeyOnShard(0, "bn", t));
  for (int t = 0; t < 2; ++t) layers.push_back(KeyOnShard(1, "bn", t));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const double mark = t * 1000 + round;
        const bn::Moments local = MakeMoments(t + 1, {mark, -mark}, {1.0, 2.0});
        absl::StatusOr<BnForwardResult> fwd =
            client->BnForward(layers[t], round, local);
        if (!fwd.ok() ||
            fwd->merged.mean != std::vector<double>{mark + 1, 1 - mark} ||
            fwd->merged.count != 2 * (t + 1)) {
          ADD_FAILURE() << "thread " << t << " round " << round << ": "
                        << (fwd.ok() ? "wrong response"
                                     : fwd.status().ToString());
          ++failures;
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(fakes_[0]->bn_requests().size(), 4u * kRounds);
  EXPECT_EQ(fakes_[0]->bn_streams(), 1);  // one stream carried all of them
  EXPECT_EQ(fakes_[1]->bn_streams(), 1);
}

TEST_F(GrpcPsClientTest, BnResponseCodeBecomesStatus) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward("fail.bn", 0, MakeMoments(2, {1}, {1}));
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fwd.status().message(), HasSubstr("layer is not ready"));
  EXPECT_THAT(fwd.status().message(), HasSubstr("fail.bn"));
  // The stream survives an error response.
  EXPECT_TRUE(client->BnForward("ok.bn", 0, MakeMoments(2, {1}, {1})).ok());
}

// Protobuf parses a response whole, so bytes it cannot parse have no id:
// they drop the stream, and the call is retried once on a fresh one.
TEST_F(GrpcPsClientTest, UnreadableBnResponseDropsTheStream) {
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kUnreadable);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward(layer, 0, MakeMoments(2, {1}, {1}));
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kUnavailable)
      << fwd.status();
  EXPECT_THAT(fwd.status().message(), HasSubstr("malformed BN response"));
  EXPECT_THAT(fwd.status().message(), HasSubstr(layer));
  EXPECT_EQ(fakes_[0]->bn_streams(), 2);
}

TEST_F(GrpcPsClientTest, BnCallRetriesOnceOnAFreshStream) {
  const std::string layer = KeyOnShard(1, "bn");
  fakes_[1]->set_bn_mode(BnMode::kBreakFirst);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward(layer, 0, MakeMoments(2, {1}, {1}));
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fakes_[1]->bn_streams(), 2);
  EXPECT_EQ(fakes_[1]->bn_requests().size(), 2u);
}

TEST_F(GrpcPsClientTest, BnStreamEndedWhileIdleIsReplacedByTheNextCall) {
  // The server answers the first call and then ends the stream while the
  // client has nothing outstanding. The next call finds the end and repeats
  // itself on a fresh stream.
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kEndAfterAnswer);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<BnForwardResult> fwd =
        client->BnForward(layer, step, MakeMoments(2, {1.0 * step}, {1}));
    ASSERT_TRUE(fwd.ok()) << "step " << step << ": " << fwd.status();
    EXPECT_EQ(fwd->merged.mean, std::vector<double>{step + 1.0});
    if (step == 0) absl::SleepFor(absl::Milliseconds(50));  // let it end
  }
  EXPECT_EQ(fakes_[0]->bn_streams(), 2);
}

TEST_F(GrpcPsClientTest, BnStreamRefusedByServerIsNotRetried) {
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kRefuse);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward(layer, 0, MakeMoments(2, {1}, {1}));
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kPermissionDenied)
      << fwd.status();
  EXPECT_EQ(fakes_[0]->bn_streams(), 1);
}

TEST_F(GrpcPsClientTest, SpinningBnCallersGetTheirOwnResponses) {
  // Callers that poll before they block (bn_spin) still hand each answer to
  // its own caller, whoever holds the poller token.
  fakes_[0]->set_bn_mode(BnMode::kReverseBatches, 3);
  GrpcClientOptions options = Options();
  options.bn_spin = absl::Microseconds(200);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  constexpr int kThreads = 3;
  constexpr int kRounds = 20;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string layer = KeyOnShard(0, "bn", t);
      for (int round = 0; round < kRounds; ++round) {
        const double mark = t * 1000 + round;
        absl::StatusOr<BnForwardResult> fwd = client->BnForward(
            layer, round, MakeMoments(t + 1, {mark}, {1.0}));
        if (!fwd.ok() || fwd->merged.mean != std::vector<double>{mark + 1}) {
          ADD_FAILURE() << "thread " << t << " round " << round << ": "
                        << (fwd.ok() ? "wrong response"
                                     : fwd.status().ToString());
          ++failures;
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(fakes_[0]->bn_requests().size(), 1u * kThreads * kRounds);
}

TEST_F(GrpcPsClientTest, BnSpinLongerThanTheDeadlineStillTimesOut) {
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kHold);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(100);
  options.bn_spin = absl::Seconds(1);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward(layer, 0, MakeMoments(2, {1}, {1}));
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kDeadlineExceeded)
      << fwd.status();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));  // under the spin
}

TEST_F(GrpcPsClientTest, BnCallTimesOutWhenNoResponseComes) {
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kHold);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(300);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<BnForwardResult> fwd =
      client->BnForward(layer, 0, MakeMoments(2, {1}, {1}));
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kDeadlineExceeded)
      << fwd.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(GrpcPsClientTest, BnCallersSharingAStreamEachTimeOutOnTime) {
  // Callers on one stream start 60 ms apart and are never answered. Whichever
  // of them polls the stream, each must give up at its own deadline.
  fakes_[0]->set_bn_mode(BnMode::kHold);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(400);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  constexpr int kThreads = 4;
  std::vector<absl::Status> status(kThreads);
  std::vector<absl::Duration> took(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      absl::SleepFor(absl::Milliseconds(60) * t);
      const absl::Time start = absl::Now();
      status[t] = client
                      ->BnForward(KeyOnShard(0, "bn", t), 0,
                                  MakeMoments(2, {1.0 * t}, {1}))
                      .status();
      took[t] = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(status[t].code(), absl::StatusCode::kDeadlineExceeded)
        << "caller " << t << ": " << status[t];
    EXPECT_GE(took[t], absl::Milliseconds(390)) << "caller " << t;
    EXPECT_LT(took[t], absl::Seconds(3)) << "caller " << t;
  }
  EXPECT_EQ(fakes_[0]->bn_streams(), 1);  // timeouts leave the stream usable
}

TEST_F(GrpcPsClientTest, LateBnResponseOfACallerThatGaveUpIsDropped) {
  // Shard 0 answers pairs of requests, in reverse order: the first call times
  // out; the second releases both answers, its own first. The late answer
  // must not reach anyone else, and the stream stays in use.
  fakes_[0]->set_bn_mode(BnMode::kReverseBatches, 2);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(300);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const std::string layer = KeyOnShard(0, "bn");
  // Expects the answer to this worker's moments {mark}.
  auto forward = [&](double mark) -> absl::Status {
    absl::StatusOr<BnForwardResult> fwd =
        client->BnForward(layer, 0, MakeMoments(1, {mark}, {1}));
    if (!fwd.ok()) return fwd.status();
    if (fwd->merged.mean != std::vector<double>{mark + 1}) {
      return absl::InternalError(
          absl::StrCat("mark ", mark, ": got another call's answer"));
    }
    return absl::OkStatus();
  };
  EXPECT_EQ(forward(1).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(forward(2).ok());
  // Two concurrent callers release each other's answers; either of them may
  // take the late answer of mark 1 from the stream first.
  absl::Status third;
  std::thread other([&] { third = forward(3); });
  const absl::Status fourth = forward(4);
  other.join();
  EXPECT_TRUE(third.ok()) << third;
  EXPECT_TRUE(fourth.ok()) << fourth;
  EXPECT_EQ(fakes_[0]->bn_requests().size(), 4u);
  EXPECT_EQ(fakes_[0]->bn_streams(), 1);
}

TEST_F(GrpcPsClientTest, BnWriteStuckInFlowControlIsCancelled) {
  // The server never reads: a large request cannot be written. The watchdog
  // cancels the stream after the deadline.
  const std::string layer = KeyOnShard(0, "bn");
  fakes_[0]->set_bn_mode(BnMode::kNoRead);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(500);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const int64_t channels = 400000;  // 6.4 MB of moments
  bn::Moments big = bn::Moments::Empty(channels);
  const absl::Time start = absl::Now();
  absl::StatusOr<BnForwardResult> fwd = client->BnForward(layer, 0, big);
  EXPECT_FALSE(fwd.ok());
  EXPECT_TRUE(fwd.status().code() == absl::StatusCode::kDeadlineExceeded ||
              fwd.status().code() == absl::StatusCode::kUnavailable)
      << fwd.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
}

TEST_F(GrpcPsClientTest, DestroyingAClientWithOpenStreamsIsPrompt) {
  fakes_[1]->set_bn_mode(BnMode::kIgnoreHalfClose);
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(
      client->BnForward(KeyOnShard(0, "bn"), 0, MakeMoments(2, {1}, {1})).ok());
  ASSERT_TRUE(
      client->BnForward(KeyOnShard(1, "bn"), 0, MakeMoments(2, {1}, {1})).ok());
  const absl::Time start = absl::Now();
  client.reset();
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Seconds(5));
  // Shard 0 saw a clean close; shard 1 ignored it and was cancelled.
  ASSERT_TRUE(fakes_[0]->AwaitBnStreamEnded());
  ASSERT_TRUE(fakes_[1]->AwaitBnStreamEnded());
  EXPECT_FALSE(fakes_[0]->last_bn_stream_cancelled());
  EXPECT_TRUE(fakes_[1]->last_bn_stream_cancelled());
}

TEST_F(GrpcPsClientTest, DestroyingAClientWithAHeldCallIsPrompt) {
  fakes_[0]->set_bn_mode(BnMode::kHold);
  GrpcClientOptions options = Options();
  options.rpc_timeout = absl::Milliseconds(200);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  EXPECT_FALSE(
      client->BnForward(KeyOnShard(0, "bn"), 0, MakeMoments(2, {1}, {1})).ok());
  const absl::Time start = absl::Now();
  client.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(GrpcPsClientTest, HeartbeatsReachEveryShard) {
  GrpcClientOptions options = Options();
  options.heartbeat_interval = absl::Milliseconds(30);
  std::unique_ptr<GrpcPsClient> client = Connect(options);
  ASSERT_NE(client, nullptr);
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while ((fakes_[0]->heartbeats() < 3 || fakes_[1]->heartbeats() < 3) &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(fakes_[0]->heartbeats(), 3);
  EXPECT_GE(fakes_[1]->heartbeats(), 3);
  HeartbeatStats stats = client->heartbeat_stats();
  EXPECT_EQ(stats.failed, 0);
  EXPECT_EQ(stats.live_workers, (std::vector<int>{0, 1}));
}

TEST_F(GrpcPsClientTest, HeartbeatIntervalMustBeShorterThanServerTimeout) {
  GrpcClientOptions options = Options();
  options.heartbeat_interval = absl::Seconds(20);  // servers time out at 10 s
  EXPECT_EQ(GrpcPsClient::Connect(options).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(GrpcPsClientTest, ClocksGoToShardZero) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->StartStep(0).ok());
  ASSERT_TRUE(client->FinishStep(1).ok());
  ASSERT_TRUE(client->StartStep(1).ok());
  EXPECT_EQ(fakes_[0]->started_steps(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(fakes_[0]->finished_clocks(), (std::vector<int64_t>{1}));
  EXPECT_TRUE(fakes_[1]->started_steps().empty());
  EXPECT_EQ(client->StartStep(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcPsClientTest, GetStatusAsksTheNamedShard) {
  std::unique_ptr<GrpcPsClient> client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<proto::StatusResponse> status = client->GetStatus(1);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->config().shard(), 1);
  EXPECT_EQ(client->GetStatus(2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bnps::client
