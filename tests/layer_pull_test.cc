// The layer-by-layer pull (PsClient::StartPull, PullParametersRequest's
// in_order) against real shard servers on 127.0.0.1: keys come in the order
// asked, each as soon as its update is applied; a key that is not ready
// holds back only itself and the keys after it on its shard; errors reach
// Wait and Finish with the servers' status; the values are those of a whole
// pull, bit for bit.

#include <memory>
#include <string>
#include <vector>

#include "client/grpc_ps_client.h"
#include "gtest/gtest.h"
#include "proto/sharding.h"
#include "server/server_runner.h"

namespace bnps {
namespace {

using client::GrpcPsClient;
using client::Param;
using client::Params;

constexpr int kShards = 2;

class LayerPullTest : public ::testing::Test {
 protected:
  void Start(absl::Duration barrier_timeout) {
    server::ShardOptions o;
    o.num_shards = kShards;
    o.num_workers = 2;
    o.barrier_timeout = barrier_timeout;
    for (int s = 0; s < kShards; ++s) {
      o.shard = s;
      auto r = server::RunningServer::Start(o, "127.0.0.1:0");
      ASSERT_TRUE(r.ok()) << r.status();
      addresses_.push_back("127.0.0.1:" + std::to_string((*r)->port()));
      servers_.push_back(*std::move(r));
    }
    for (int w = 0; w < 2; ++w) {
      client::GrpcClientOptions c;
      c.servers = addresses_;
      c.job = "bnps";
      c.worker = w;
      c.num_workers = 2;
      c.rpc_timeout = absl::Seconds(20);
      auto client = GrpcPsClient::Connect(c);
      ASSERT_TRUE(client.ok()) << client.status();
      clients_.push_back(*std::move(client));
    }
    // a0 and b0 on shard 0, a1 on shard 1.
    a0_ = KeyOnShard(0, "a");
    b0_ = KeyOnShard(0, "b");
    a1_ = KeyOnShard(1, "a");
    Params init;
    init[a0_] = Param{{3}, {1, 2, 3}};
    init[b0_] = Param{{2, 2}, {4, 5, 6, 7}};
    init[a1_] = Param{{1}, {8}};
    ASSERT_TRUE(clients_[0]->InitParameters(init).ok());
  }

  static std::string KeyOnShard(int shard, const std::string& base) {
    for (int i = 0;; ++i) {
      std::string key = base + std::to_string(i);
      if (proto::ShardForKey(key, kShards) == shard) return key;
    }
  }

  // Worker w's step-0 gradient of `key` (all ones), alone.
  void Push(int w, const std::string& key) {
    Params g;
    const Param& shape = shapes_.at(key);
    g[key] = Param{shape.shape, std::vector<float>(shape.values.size(), 1)};
    ASSERT_TRUE(clients_[w]->PushGradients(0, 1, g).ok());
  }

  void SetUp() override {
    shapes_[KeyOnShard(0, "a")] = Param{{3}, {0, 0, 0}};
    shapes_[KeyOnShard(0, "b")] = Param{{2, 2}, {0, 0, 0, 0}};
    shapes_[KeyOnShard(1, "a")] = Param{{1}, {0}};
  }

  std::vector<std::unique_ptr<server::RunningServer>> servers_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<GrpcPsClient>> clients_;
  std::map<std::string, Param> shapes_;
  std::string a0_, b0_, a1_;
};

// Worker 1 is behind: only the keys it pushed can come, and they do -- a
// pull that waited for every key would time out on b0 instead.
TEST_F(LayerPullTest, EachKeyComesOnceItsUpdateIsApplied) {
  Start(absl::Seconds(30));
  for (const std::string& k : {a0_, b0_, a1_}) Push(0, k);
  Push(1, a0_);
  Params into;
  std::unique_ptr<client::ParameterPull> pull =
      clients_[0]->StartPull(1, {a0_, b0_, a1_}, &into);
  ASSERT_EQ(into.size(), 3u);
  ASSERT_TRUE(pull->Wait(a0_).ok());
  Push(1, a1_);  // on the other shard: not behind b0
  ASSERT_TRUE(pull->Wait(a1_).ok());
  Push(1, b0_);
  ASSERT_TRUE(pull->Wait(b0_).ok());
  ASSERT_TRUE(pull->Finish().ok());
  EXPECT_EQ(pull->Wait("nope").code(), absl::StatusCode::kNotFound);

  // The same values as a whole pull, bit for bit.
  absl::StatusOr<Params> whole = clients_[1]->PullParameters(1);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const std::string& k : {a0_, b0_, a1_}) {
    EXPECT_EQ(into[k].shape, whole->at(k).shape) << k;
    EXPECT_EQ(into[k].values, whole->at(k).values) << k;
    EXPECT_NE(into[k].values, shapes_[k].values) << k << ": not updated";
  }
}

// b0 never gets worker 1's push: the keys before it (and the other shard's)
// come; b0's Wait and Finish give the servers' DEADLINE_EXCEEDED naming the
// worker.
TEST_F(LayerPullTest, AKeyThatTimesOutFailsOnlyItself) {
  Start(absl::Seconds(1));
  for (const std::string& k : {a0_, b0_, a1_}) Push(0, k);
  Push(1, a0_);
  Push(1, a1_);
  Params into;
  std::unique_ptr<client::ParameterPull> pull =
      clients_[0]->StartPull(1, {a0_, b0_, a1_}, &into);
  EXPECT_TRUE(pull->Wait(a0_).ok());
  EXPECT_TRUE(pull->Wait(a1_).ok());
  const absl::Status b = pull->Wait(b0_);
  EXPECT_EQ(b.code(), absl::StatusCode::kDeadlineExceeded) << b;
  EXPECT_NE(b.message().find("waits for workers [1]"), std::string::npos) << b;
  const absl::Status all = pull->Finish();
  EXPECT_EQ(all.code(), absl::StatusCode::kDeadlineExceeded) << all;
}

TEST_F(LayerPullTest, BadKeysAreRefused) {
  Start(absl::Seconds(30));
  Params into;
  std::unique_ptr<client::ParameterPull> pull =
      clients_[0]->StartPull(0, {a0_, "nope"}, &into);
  EXPECT_EQ(pull->Wait("nope").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pull->Finish().code(), absl::StatusCode::kNotFound);
  pull = clients_[0]->StartPull(0, {a0_, a0_}, &into);
  EXPECT_EQ(pull->Finish().code(), absl::StatusCode::kInvalidArgument);
  pull = clients_[0]->StartPull(0, {}, &into);
  EXPECT_EQ(pull->Finish().code(), absl::StatusCode::kInvalidArgument);
  pull = clients_[0]->StartPull(-1, {a0_}, &into);
  EXPECT_EQ(pull->Finish().code(), absl::StatusCode::kInvalidArgument);
}

// A pull dropped before its keys come (its step failed) stops its calls;
// the client goes on.
TEST_F(LayerPullTest, AnAbandonedPullStops) {
  Start(absl::Seconds(30));
  Params into;
  std::unique_ptr<client::ParameterPull> pull =
      clients_[0]->StartPull(1, {a0_, b0_, a1_}, &into);
  pull.reset();
  pull = clients_[0]->StartPull(0, {a1_, a0_}, &into);
  ASSERT_TRUE(pull->Finish().ok());
  ASSERT_EQ(into.size(), 2u);
  EXPECT_EQ(into[a1_].values, std::vector<float>{8});
  EXPECT_EQ(into[a0_].values, (std::vector<float>{1, 2, 3}));
}

}  // namespace
}  // namespace bnps
