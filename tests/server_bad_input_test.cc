// Bad input to a real shard server on 127.0.0.1 gets a clear status and never
// crashes it: unknown keys, wrong shape or dtype, NaN/Inf, a key the shard does
// not own, a worker outside the job, a step from the past, an oversized message.
// Raw stubs, so every malformed message can be sent as it is. Also pins the
// size of the server's own messages (a pull answers one chunk per message) and
// that client-supplied text cannot forge lines of the server's log.

#include <fcntl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/codec.h"
#include "proto/limits.h"
#include "proto/sharding.h"
#include "proto/wire_testing.h"
#include "server/server_runner.h"

namespace bnps {
namespace {

using grpc::StatusCode;

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server::ShardOptions o;
    o.num_shards = 2;
    o.shard = 0;
    o.num_workers = 2;
    o.barrier_timeout = absl::Seconds(5);
    auto s = server::RunningServer::Start(o, "127.0.0.1:0");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);  // to send the oversized one
    channel_ = grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(server_->port()),
        grpc::InsecureChannelCredentials(), args);
    stub_ = proto::ParameterServer::NewStub(channel_);
    // Keys this shard owns and one it does not.
    for (int i = 0; owned_.empty() || foreign_.empty(); ++i) {
      const std::string key = "param/" + std::to_string(i);
      (proto::ShardForKey(key, 2) == 0 ? owned_ : foreign_) = key;
    }
    ASSERT_EQ(Init(owned_, {1, 2, 3}, {3}).error_code(), StatusCode::OK);
    // Worker 0 registered (BN calls need it); worker 1 not.
    ASSERT_TRUE(server_->shard().Register(0, /*incarnation=*/100).ok());
  }

  grpc::Status Init(const std::string& key, const std::vector<float>& v,
                    std::vector<int64_t> shape, int worker = 0) {
    proto::InitParametersRequest req;
    req.set_job("bnps");
    req.set_worker(worker);
    proto::NamedTensor* p = req.add_parameters();
    p->set_key(key);
    proto::EncodeFloat32(v, shape, p->mutable_value());
    proto::InitParametersResponse resp;
    grpc::ClientContext ctx;
    return stub_->InitParameters(&ctx, req, &resp);
  }

  grpc::Status Push(const proto::PushGradientsRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::PushGradientsResponse resp;
    auto writer = stub_->PushGradients(&ctx, &resp);
    writer->Write(req);
    writer->WritesDone();
    return writer->Finish();
  }

  proto::PushGradientsRequest Grad(const std::string& key,
                                   const std::vector<float>& v,
                                   std::vector<int64_t> shape, int64_t step = 0,
                                   int worker = 0) {
    proto::PushGradientsRequest req;
    req.set_job("bnps");
    req.set_worker(worker);
    req.set_step(step);
    req.set_num_samples(1);
    proto::AppendChunks(key, shape, v, proto::kChunkFloats, req.mutable_chunks());
    return req;
  }

  proto::BnResponse Bn(const proto::BnRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub_->BnSync(&ctx);
    proto::BnResponse resp;
    EXPECT_TRUE(stream->Write(req));
    EXPECT_TRUE(stream->Read(&resp));
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
    return resp;
  }

  // The server still answers after whatever came before.
  void ExpectAlive() {
    proto::StatusRequest req;
    proto::StatusResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetStatus(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.num_parameters(), 1);
  }

  std::unique_ptr<server::RunningServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::ParameterServer::Stub> stub_;
  std::string owned_, foreign_;
};

TEST_F(BadInputTest, InitParameters) {
  EXPECT_EQ(Init(foreign_, {1}, {1}).error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Init(owned_, {1, 2}, {3}).error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Init(owned_, {1, NAN, 3}, {3}).error_code(),
            StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Init(owned_, {1, 2, 3}, {3}, /*worker=*/7).error_code(),
            StatusCode::INVALID_ARGUMENT);
  ExpectAlive();
}

TEST_F(BadInputTest, PushGradients) {
  EXPECT_EQ(Push(Grad("param/nope", {1}, {1})).error_code(),
            proto::ShardForKey("param/nope", 2) == 0 ? StatusCode::NOT_FOUND
                                                       : StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Push(Grad(foreign_, {1}, {1})).error_code(), StatusCode::INVALID_ARGUMENT);
  // A few bytes declaring 2^30 elements (4 GiB) of a key the shard owns but
  // never initialized: refused before room is reserved for them.
  std::string unknown;
  for (int i = 0; unknown.empty(); ++i) {
    const std::string key = "param/unknown/" + std::to_string(i);
    if (proto::ShardForKey(key, 2) == 0) unknown = key;
  }
  proto::PushGradientsRequest huge = Grad(unknown, {1}, {1});
  huge.mutable_chunks(0)->set_shape(0, proto::kMaxTensorElements);
  {
    const grpc::Status s = Push(huge);
    EXPECT_EQ(s.error_code(), StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_NE(s.error_message().find(unknown), std::string::npos)
        << s.error_message();
  }
  huge.mutable_chunks(0)->set_key(owned_);  // an existing key, another shape
  EXPECT_EQ(Push(huge).error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Push(Grad(owned_, {1, 2}, {2})).error_code(),
            StatusCode::INVALID_ARGUMENT);  // wrong shape
  EXPECT_EQ(Push(Grad(owned_, {1, INFINITY, 3}, {3})).error_code(),
            StatusCode::INVALID_ARGUMENT);
  proto::PushGradientsRequest bad_dtype = Grad(owned_, {1, 2, 3}, {3});
  bad_dtype.mutable_chunks(0)->mutable_part()->set_dtype(proto::DTYPE_FLOAT64);
  EXPECT_EQ(Push(bad_dtype).error_code(), StatusCode::INVALID_ARGUMENT);
  proto::PushGradientsRequest truncated = Grad(owned_, {1, 2, 3}, {3});
  truncated.mutable_chunks(0)->mutable_part()->mutable_data()->resize(5);
  EXPECT_EQ(Push(truncated).error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Push(Grad(owned_, {1, 2, 3}, {3}, 0, /*worker=*/2)).error_code(),
            StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Push(Grad(owned_, {1, 2, 3}, {3}, /*step=*/-1)).error_code(),
            StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Push(Grad(owned_, {1, 2, 3}, {3}, /*step=*/9)).error_code(),
            StatusCode::FAILED_PRECONDITION);  // from the future
  proto::PushGradientsRequest other_job = Grad(owned_, {1, 2, 3}, {3});
  other_job.set_job("someone-else");
  EXPECT_EQ(Push(other_job).error_code(), StatusCode::INVALID_ARGUMENT);
  ExpectAlive();
}

TEST_F(BadInputTest, OversizedMessageIsRefused) {
  const std::vector<float> big(3 << 20, 1.0f);  // 12 MB in one message
  proto::PushGradientsRequest req = Grad(owned_, big, {3 << 20}, 0);
  req.clear_chunks();
  proto::AppendChunks(owned_, {3 << 20}, big, 3 << 20, req.mutable_chunks());
  EXPECT_EQ(Push(req).error_code(), StatusCode::RESOURCE_EXHAUSTED);
  ExpectAlive();
}

TEST_F(BadInputTest, BnSync) {
  bn::Moments m;
  m.count = 4;
  m.mean = {0.5, 1.0};
  m.m2 = {1.0, 2.0};
  // A BN layer key this shard owns.
  std::string layer;
  for (int i = 0; layer.empty(); ++i) {
    const std::string k = "bn/" + std::to_string(i);
    if (proto::ShardForKey(k, 2) == 0) layer = k;
  }
  proto::BnRequest req;
  req.set_id(11);
  req.set_job("bnps");
  req.set_worker(0);
  req.set_layer(layer);
  req.set_phase(proto::BN_FORWARD);
  proto::EncodeMoments(m, req.mutable_moments());

  // A worker id that never registered takes no part in BN (it
  // would be marked as having taken part, and the real worker could not
  // join); BN_RUNNING, a read, is the exception.
  {
    proto::BnRequest one = req;
    one.set_worker(1);
    proto::BnResponse unregistered = Bn(one);
    EXPECT_EQ(unregistered.code(),
              static_cast<int>(StatusCode::FAILED_PRECONDITION));
    EXPECT_NE(unregistered.message().find("has not registered"),
              std::string::npos)
        << unregistered.message();
    proto::BnRequest read = one;
    read.clear_moments();
    read.set_phase(proto::BN_RUNNING);
    EXPECT_EQ(Bn(read).code(), static_cast<int>(StatusCode::NOT_FOUND));
  }
  ASSERT_TRUE(server_->shard().Register(1, /*incarnation=*/101).ok());

  proto::BnRequest nan = req;
  bn::Moments bad = m;
  bad.m2[1] = NAN;
  proto::EncodeMoments(bad, nan.mutable_moments());
  proto::BnResponse r = Bn(nan);
  EXPECT_EQ(r.id(), 11u);
  EXPECT_EQ(r.code(), static_cast<int>(StatusCode::INVALID_ARGUMENT));
  EXPECT_FALSE(r.message().empty());

  proto::BnRequest negative = req;
  bad = m;
  bad.m2[0] = -1;
  proto::EncodeMoments(bad, negative.mutable_moments());
  EXPECT_EQ(Bn(negative).code(), static_cast<int>(StatusCode::INVALID_ARGUMENT));

  proto::BnRequest not_owned = req;
  for (int i = 0;; ++i) {
    const std::string k = "bn/" + std::to_string(i);
    if (proto::ShardForKey(k, 2) == 1) {
      not_owned.set_layer(k);
      break;
    }
  }
  EXPECT_EQ(Bn(not_owned).code(), static_cast<int>(StatusCode::INVALID_ARGUMENT));

  proto::BnRequest stranger = req;
  stranger.set_worker(5);
  EXPECT_EQ(Bn(stranger).code(), static_cast<int>(StatusCode::INVALID_ARGUMENT));

  proto::BnRequest no_phase = req;
  no_phase.set_phase(proto::BN_PHASE_UNSPECIFIED);
  EXPECT_EQ(Bn(no_phase).code(), static_cast<int>(StatusCode::INVALID_ARGUMENT));

  proto::BnRequest wrong_dtype = req;
  wrong_dtype.mutable_moments()->mutable_mean()->set_dtype(proto::DTYPE_FLOAT32);
  EXPECT_EQ(Bn(wrong_dtype).code(), static_cast<int>(StatusCode::INVALID_ARGUMENT));

  // A step from the past: run step 0..20 alone (worker 1 removed by shrink is
  // not available here), so use the recal phase's past check instead: finish
  // recalibration, then send another batch.
  proto::BnRequest recal = req;
  recal.set_phase(proto::BN_RECAL);
  for (int w = 0; w < 2; ++w) {
    recal.set_worker(w);
    EXPECT_EQ(Bn(recal).code(), 0);
  }
  proto::BnRequest finish = req;
  finish.clear_moments();
  finish.set_phase(proto::BN_RECAL_FINISH);
  {
    grpc::ClientContext c0, c1;
    auto s0 = stub_->BnSync(&c0);
    auto s1 = stub_->BnSync(&c1);
    finish.set_worker(0);
    ASSERT_TRUE(s0->Write(finish));
    finish.set_worker(1);
    ASSERT_TRUE(s1->Write(finish));
    proto::BnResponse r0, r1;
    ASSERT_TRUE(s0->Read(&r0));
    ASSERT_TRUE(s1->Read(&r1));
    EXPECT_EQ(r0.code(), 0) << r0.message();
    EXPECT_TRUE(r0.has_running());
    s0->WritesDone();
    s1->WritesDone();
    EXPECT_TRUE(s0->Finish().ok());
    EXPECT_TRUE(s1->Finish().ok());
  }
  recal.set_step(99);
  EXPECT_EQ(Bn(recal).code(), static_cast<int>(StatusCode::FAILED_PRECONDITION));
  ExpectAlive();
}

// Bytes that are not a BnRequest end the stream with INVALID_ARGUMENT, after
// the answer to the valid request sent before them.
TEST_F(BadInputTest, MalformedBnBytesEndTheStream) {
  std::string layer;
  for (int i = 0; layer.empty(); ++i) {
    const std::string k = "bn/" + std::to_string(i);
    if (proto::ShardForKey(k, 2) == 0) layer = k;
  }
  proto::BnRequest recal;
  recal.set_id(5);
  recal.set_job("bnps");
  recal.set_layer(layer);
  recal.set_phase(proto::BN_RECAL);
  proto::EncodeMoments(bn::Moments{2, {0.5}, {1.0}}, recal.mutable_moments());
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream =
      generic.PrepareCall(&ctx, "/bnps.proto.ParameterServer/BnSync", &cq);
  // One operation at a time, each awaited before the next.
  auto await = [&cq](void* want) {
    void* tag;
    bool ok;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, want);
    return ok;
  };
  void* const kTag = reinterpret_cast<void*>(1);
  stream->StartCall(kTag);
  ASSERT_TRUE(await(kTag));
  const std::string valid = recal.SerializeAsString();
  // Field 7 (moments) declared 5 bytes long, with only 3 of them.
  const std::string truncated("\x3a\x05\x08\x82\x01", 5);
  for (const std::string* bytes : {&valid, &truncated}) {
    grpc::Slice slice(bytes->data(), bytes->size());
    stream->Write(grpc::ByteBuffer(&slice, 1), kTag);
    ASSERT_TRUE(await(kTag));
  }
  grpc::ByteBuffer answer;
  stream->Read(&answer, kTag);
  ASSERT_TRUE(await(kTag));
  proto::BnResponse r;
  ASSERT_TRUE(r.ParseFromString(proto::Flatten(answer)));
  EXPECT_EQ(r.id(), 5u);
  EXPECT_EQ(r.code(), 0) << r.message();
  stream->Read(&answer, kTag);
  EXPECT_FALSE(await(kTag));  // no more answers: the stream ended
  grpc::Status end;
  stream->Finish(&end, kTag);
  ASSERT_TRUE(await(kTag));
  EXPECT_EQ(end.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(end.error_message().find("malformed"), std::string::npos)
      << end.error_message();
  ExpectAlive();
}

TEST_F(BadInputTest, RegisterAdmitsOneProcessPerWorker) {
  auto reg = [&](uint64_t incarnation) {
    proto::RegisterRequest req;
    req.set_job("bnps");
    req.set_worker(1);
    req.set_num_workers(2);
    req.set_num_shards(2);
    req.set_incarnation(incarnation);
    proto::RegisterResponse resp;
    grpc::ClientContext ctx;
    return stub_->Register(&ctx, req, &resp);
  };
  auto beat = [&](uint64_t incarnation) {
    proto::HeartbeatRequest req;
    req.set_job("bnps");
    req.set_worker(1);
    req.set_incarnation(incarnation);
    proto::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    return stub_->Heartbeat(&ctx, req, &resp);
  };
  EXPECT_EQ(reg(0).error_code(), StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(reg(41).ok());
  EXPECT_TRUE(reg(41).ok());  // a retry
  const grpc::Status twice = reg(42);
  EXPECT_EQ(twice.error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(twice.error_message().find("worker 1 is already registered"),
            std::string::npos)
      << twice.error_message();
  EXPECT_TRUE(beat(41).ok());
  EXPECT_EQ(beat(42).error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(beat(0).error_code(), StatusCode::INVALID_ARGUMENT);
  ExpectAlive();
}

TEST_F(BadInputTest, RegisterChecksTheJobShape) {
  proto::RegisterRequest req;
  req.set_job("bnps");
  req.set_worker(1);  // worker 0 is registered by another incarnation
  req.set_num_workers(3);  // the server runs 2
  req.set_num_shards(2);
  req.set_incarnation(7);
  proto::RegisterResponse resp;
  grpc::ClientContext ctx;
  EXPECT_EQ(stub_->Register(&ctx, req, &resp).error_code(),
            StatusCode::FAILED_PRECONDITION);
  req.set_num_workers(2);
  grpc::ClientContext ctx2;
  ASSERT_TRUE(stub_->Register(&ctx2, req, &resp).ok());
  EXPECT_EQ(resp.config().num_workers(), 2);
  EXPECT_EQ(resp.config().policy(), proto::POLICY_SYNC);
  proto::StartStepRequest start;
  start.set_job("bnps");
  start.set_worker(0);
  proto::StartStepResponse sresp;
  grpc::ClientContext ctx3;
  EXPECT_EQ(stub_->StartStep(&ctx3, start, &sresp).error_code(),
            StatusCode::FAILED_PRECONDITION);  // not async
}

TEST_F(BadInputTest, ClientStringsCannotForgeLogLines) {
  const std::string forged = "bnps_server[0]: forged";
  ::testing::internal::CaptureStderr();  // where the server logs
  // A job name with a newline. (One that is not UTF-8 does not get this far:
  // protobuf refuses to parse it.)
  proto::InitParametersRequest init;
  init.set_job("evil\n" + forged);
  proto::NamedTensor* p = init.add_parameters();
  p->set_key(owned_);
  proto::EncodeFloat32({1, 2, 3}, {3}, p->mutable_value());
  proto::InitParametersResponse init_resp;
  grpc::ClientContext ctx;
  EXPECT_EQ(stub_->InitParameters(&ctx, init, &init_resp).error_code(),
            StatusCode::INVALID_ARGUMENT);
  // A pushed key with terminal escapes and a line break, and a BN layer this
  // shard does not own, quoted back in the rejection. (A key that is not
  // UTF-8 is refused as malformed before it is quoted, as protobuf would.)
  std::string key, layer;
  for (int i = 0; key.empty() || layer.empty(); ++i) {
    const std::string k =
        absl::StrCat("param/", i, "\x1b[2J\r\n", forged, " key");
    const std::string l = absl::StrCat("bn/", i, "\n", forged, " layer");
    if (key.empty() && proto::ShardForKey(k, 2) == 1) key = k;
    if (layer.empty() && proto::ShardForKey(l, 2) == 1) layer = l;
  }
  EXPECT_EQ(Push(Grad(key, {1}, {1})).error_code(), StatusCode::INVALID_ARGUMENT);
  proto::BnRequest bn;
  bn.set_id(1);
  bn.set_job("bnps");
  bn.set_layer(layer);
  bn.set_phase(proto::BN_FORWARD);
  bn::Moments m;
  m.count = 1;
  m.mean = {0.5};
  m.m2 = {0.0};
  proto::EncodeMoments(m, bn.mutable_moments());
  EXPECT_EQ(Bn(bn).code(), static_cast<int>(StatusCode::INVALID_ARGUMENT));
  const std::string log = ::testing::internal::GetCapturedStderr();

  // Each rejection was logged, on one line, with the client's text escaped.
  for (const absl::string_view needle :
       {"evil\\nbnps_server[0]: forged",
        "\\x1b[2J\\r\\nbnps_server[0]: forged key",
        "\\nbnps_server[0]: forged layer"}) {
    EXPECT_TRUE(absl::StrContains(log, needle)) << needle << " not in:\n" << log;
  }
  for (const absl::string_view line : absl::StrSplit(log, '\n')) {
    EXPECT_FALSE(absl::StartsWith(line, forged)) << "forged line: " << line;
    EXPECT_FALSE(absl::StrContains(line, '\r')) << line;
  }
  EXPECT_FALSE(absl::StrContains(log, "\x1b")) << "raw escape logged";
  ExpectAlive();
}

TEST_F(BadInputTest, PullAnswersOneFullChunkPerMessage) {
  std::string big;
  for (int i = 0; big.empty(); ++i) {
    const std::string key = "big/" + std::to_string(i);
    if (proto::ShardForKey(key, 2) == 0) big = key;
  }
  // 5.5 chunks, under the 8 MB limit of one (unchunked) init message.
  const int64_t n = 5 * proto::kChunkFloats + proto::kChunkFloats / 2;
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 1000);
  ASSERT_EQ(Init(big, values, {n}).error_code(), StatusCode::OK);

  proto::PullParametersRequest req;
  req.set_job("bnps");
  req.set_worker(0);
  req.add_keys(big);
  req.add_keys(owned_);  // 3 floats: packed with another chunk
  grpc::ClientContext ctx;
  auto reader = stub_->PullParameters(&ctx, req);
  proto::PullParametersResponse resp;
  std::vector<int> chunks_per_message;
  std::vector<float> got(n, -1.0f);
  int small_chunks = 0;
  while (reader->Read(&resp)) {
    EXPECT_LE(static_cast<int64_t>(resp.ByteSizeLong()),
              proto::kBulkMessageBytes);
    chunks_per_message.push_back(resp.chunks_size());
    for (const proto::TensorChunk& c : resp.chunks()) {
      if (c.key() == owned_) {
        ++small_chunks;
        continue;
      }
      ASSERT_EQ(c.key(), big);
      ASSERT_EQ(c.part().data().size() % sizeof(float), 0u);
      const int64_t len = c.part().data().size() / sizeof(float);
      ASSERT_LE(c.offset() + len, n);
      std::memcpy(&got[c.offset()], c.part().data().data(),
                  c.part().data().size());
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  // Six chunks of the big tensor, one message each; the small tensor rides
  // along with the last (half) chunk.
  EXPECT_EQ(chunks_per_message, (std::vector<int>{1, 1, 1, 1, 1, 2}));
  EXPECT_EQ(small_chunks, 1);
  EXPECT_EQ(got, values);
}

// Sends `bytes` as the request of `method` (any kind of rpc) and returns how
// the call ended.
grpc::Status CallWithBytes(const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& method,
                           const std::string& bytes) {
  grpc::GenericStub generic(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call = generic.PrepareCall(
      &ctx, "/bnps.proto.ParameterServer/" + method, &cq);
  void* const kTag = reinterpret_cast<void*>(1);
  // One operation at a time, each awaited before the next; a failed one
  // (the server ended the call) is fine.
  auto await = [&cq, kTag] {
    void* tag;
    bool ok;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, kTag);
    return ok;
  };
  call->StartCall(kTag);
  await();
  grpc::Slice slice(bytes.data(), bytes.size());
  call->Write(grpc::ByteBuffer(&slice, 1), kTag);
  await();
  call->WritesDone(kTag);
  await();
  grpc::ByteBuffer answer;
  for (int i = 0; i < 100; ++i) {  // a bounded drain of any answers
    call->Read(&answer, kTag);
    if (!await()) break;
  }
  grpc::Status end;
  call->Finish(&end, kTag);
  await();
  return end;
}

// Bytes that are not the method's request get INVALID_ARGUMENT with a message
// and a log line, on every method (gRPC's typed handlers answered
// UNIMPLEMENTED with no message, PullParameters INTERNAL).
TEST_F(BadInputTest, UnparseableRequestsGetInvalidArgument) {
  const std::vector<std::string> garbage = {
      std::string("\x0a\x05" "ab", 4),  // field 1: 5 bytes long, 2 there
      std::string(6, '\xff'),           // a tag that never ends
  };
  const std::vector<std::string> methods = {
      "Register",  "Heartbeat",  "InitParameters", "StartStep",
      "FinishStep", "GetStatus", "PullParameters", "PushGradients"};
  ::testing::internal::CaptureStderr();
  for (const std::string& method : methods) {
    for (const std::string& bytes : garbage) {
      const grpc::Status s = CallWithBytes(channel_, method, bytes);
      EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT)
          << method << ": " << s.error_message();
      EXPECT_NE(s.error_message().find("malformed message"), std::string::npos)
          << method << ": " << s.error_message();
    }
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  for (const std::string& method : methods) {
    bool logged = false;
    for (size_t at = log.find(method); at != std::string::npos && !logged;
         at = log.find(method, at + 1)) {
      const size_t end = log.find('\n', at);
      logged = log.substr(at, end - at).find("malformed message") !=
               std::string::npos;
    }
    EXPECT_TRUE(logged) << method << " was not logged:\n" << log;
  }
  ExpectAlive();
}

// No bytes at all (how a call cancelled on its way, e.g. held up past its
// deadline by a partition, reaches a handler) are refused as empty, not read
// as a call of worker 0 of job ''; an empty status request is still fine.
TEST_F(BadInputTest, EmptyWorkerRequestsAreRefusedAsEmpty) {
  ::testing::internal::CaptureStderr();
  for (const char* method : {"Register", "Heartbeat", "StartStep", "FinishStep"}) {
    const grpc::Status s = CallWithBytes(channel_, method, "");
    EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_NE(s.error_message().find("empty request"), std::string::npos)
        << method << ": " << s.error_message();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("Heartbeat from worker -1 rejected"), std::string::npos)
      << log;
  EXPECT_EQ(log.find("job ''"), std::string::npos) << log;
  EXPECT_TRUE(CallWithBytes(channel_, "GetStatus", "").ok());
  ExpectAlive();
}

// A push or BN call of a step far beyond what the job's clocks allow is
// refused and changes nothing: the worker's real step afterwards works (it
// was silently dropped as a duplicate, or its BN layer was "from the past").
class FutureStepTest : public ::testing::TestWithParam<policy::Policy> {};

TEST_P(FutureStepTest, IsRefusedAndChangesNothing) {
  server::ShardOptions o;
  o.num_workers = 1;
  o.policy = GetParam();
  o.staleness = 1;
  o.barrier_timeout = absl::Seconds(5);
  auto server = server::RunningServer::Start(o, "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->shard().Register(0, /*incarnation=*/100).ok());
  auto stub = proto::ParameterServer::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*server)->port()),
      grpc::InsecureChannelCredentials()));
  {
    proto::InitParametersRequest req;
    req.set_job("bnps");
    proto::NamedTensor* p = req.add_parameters();
    p->set_key("w");
    proto::EncodeFloat32({1, 2}, {2}, p->mutable_value());
    proto::InitParametersResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->InitParameters(&ctx, req, &resp).ok());
  }
  auto push = [&](int64_t step, proto::PushGradientsResponse* resp) {
    proto::PushGradientsRequest req;
    req.set_job("bnps");
    req.set_step(step);
    req.set_num_samples(1);
    proto::AppendChunks("w", std::vector<int64_t>{2}, {0.5f, 0.5f},
                        proto::kChunkFloats, req.mutable_chunks());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto writer = stub->PushGradients(&ctx, resp);
    writer->Write(req);
    writer->WritesDone();
    return writer->Finish();
  };
  auto bn = [&](int64_t step) {
    proto::BnRequest req;
    req.set_id(1);
    req.set_job("bnps");
    req.set_step(step);
    req.set_layer("bn/0");
    req.set_phase(proto::BN_FORWARD);
    proto::EncodeMoments(bn::Moments{4, {0.5, 1.0}, {1.0, 2.0}},
                         req.mutable_moments());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub->BnSync(&ctx);
    proto::BnResponse resp;
    EXPECT_TRUE(stream->Write(req));
    EXPECT_TRUE(stream->Read(&resp));
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
    return resp;
  };
  constexpr int64_t kFarFuture = 1'000'000'000'000'000;  // 10^15
  proto::PushGradientsResponse resp;
  grpc::Status s = push(kFarFuture, &resp);
  EXPECT_EQ(s.error_code(), StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("future"), std::string::npos)
      << s.error_message();
  proto::BnResponse r = bn(kFarFuture);
  EXPECT_EQ(r.code(), static_cast<int>(StatusCode::FAILED_PRECONDITION))
      << r.message();
  EXPECT_NE(r.message().find("future"), std::string::npos) << r.message();

  // The worker's real step 0.
  r = bn(0);
  EXPECT_EQ(r.code(), 0) << r.message();
  resp.Clear();
  s = push(0, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.applied(), 1);
  EXPECT_EQ(resp.duplicates(), 0);
  EXPECT_EQ((*server)->shard().store().GetStats().min_version, 1);
}

INSTANTIATE_TEST_SUITE_P(Policies, FutureStepTest,
                         ::testing::Values(policy::Policy::kSync,
                                           policy::Policy::kAsync),
                         [](const auto& info) {
                           return std::string(policy::PolicyName(info.param));
                         });

}  // namespace
}  // namespace bnps
