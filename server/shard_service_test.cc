// The gRPC adapter over an in-process channel (no sockets): what it checks
// before it reserves memory for a push.

#include "server/shard_service.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/codec.h"

namespace bnps::server {
namespace {

constexpr int64_t kHuge = int64_t{1} << 30;  // kMaxTensorElements: 4 GiB

class ShardServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardOptions o;
    o.start_ticker = false;
    absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(o);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = *std::move(shard);
    service_ = std::make_unique<ShardService>(shard_.get());
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = proto::ParameterServer::NewStub(
        server_->InProcessChannel(grpc::ChannelArguments()));
    ASSERT_TRUE(shard_->store().Init("w", {3}, {1, 2, 3}).ok());
  }

  void TearDown() override { server_->Shutdown(); }

  grpc::Status Push(const proto::PushGradientsRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::PushGradientsResponse resp;
    auto writer = stub_->PushGradients(&ctx, &resp);
    writer->Write(req);
    writer->WritesDone();
    return writer->Finish();
  }

  // A push of one chunk of `key` declaring `shape` with one element of
  // payload: a few dozen bytes that announce a tensor of any size.
  static proto::PushGradientsRequest Declaring(const std::string& key,
                                               std::vector<int64_t> shape) {
    proto::PushGradientsRequest req;
    req.set_job("bnps");
    req.set_worker(0);
    req.set_num_samples(1);
    proto::TensorChunk* c = req.add_chunks();
    c->set_key(key);
    for (int64_t d : shape) c->add_shape(d);
    proto::EncodeFloat32(std::vector<float>{1.0f}, {1}, c->mutable_part());
    return req;
  }

  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ShardService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<proto::ParameterServer::Stub> stub_;
};

// The key and shape are checked against the store before room is reserved
// for what the sender declares: a small request cannot make the server
// reserve gigabytes.
TEST_F(ShardServiceTest, DeclaredSizeIsNotReservedBeforeTheKeyIsChecked) {
  const proto::PushGradientsRequest unknown = Declaring("nope", {kHuge});
  EXPECT_LT(unknown.ByteSizeLong(), 64u);
  grpc::Status s = Push(unknown);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_NE(s.error_message().find("'nope'"), std::string::npos)
      << s.error_message();

  s = Push(Declaring("w", {kHuge}));  // a known key, another shape
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_NE(s.error_message().find("shape"), std::string::npos)
      << s.error_message();

  s = Push(Declaring("w", {3}));  // the shape, but one element of three
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_EQ(service_->scratch().largest_taken_bytes(), 3 * sizeof(float));

  // A step the store would refuse is refused at the chunk that starts the
  // tensor, not once it is complete.
  proto::PushGradientsRequest future = Declaring("w", {3});
  future.set_step(1'000'000'000'000'000);
  s = Push(future);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << s.error_message();

  // Nothing was applied; a real push works.
  proto::PushGradientsRequest real = Declaring("w", {3});
  proto::EncodeFloat32({1, 1, 1}, {3}, real.mutable_chunks(0)->mutable_part());
  s = Push(real);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(shard_->store().GetStats().applied, 1);
  EXPECT_EQ(service_->scratch().largest_taken_bytes(), 3 * sizeof(float));
}

}  // namespace
}  // namespace bnps::server
