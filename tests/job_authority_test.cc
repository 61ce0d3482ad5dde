// Job-wide operations need the job's authority (server/rollback_authority.h),
// through real servers on 127.0.0.1 (in-process, ephemeral ports): a job of
// 2 shards and 2 workers with per-worker tokens, --on_worker_loss=wait and
// a checkpoint of step 1 on each shard, so a rollback the servers accept
// succeeds. A worker's own token cannot roll the job back, resize it, push
// its generation or impose a membership; it can once a shard saw a failure
// (a worker's process replaced, a shard restarted from its checkpoint), and
// the client's recovery carries the shards' warrants to every shard. A
// worker the job counts already joins without a new generation.

#include <stdlib.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/grpc_ps_client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/bnps.grpc.pb.h"
#include "proto/generation.h"
#include "proto/sharding.h"
#include "security/job_token.h"
#include "security/worker_token.h"
#include "tests/token_session_testing.h"
#include "server/server_runner.h"

namespace bnps {
namespace {

using grpc::StatusCode;

constexpr char kToken[] = "job-authority-token-0123456789";
constexpr int kShards = 2;

// A key shard `shard` owns.
std::string KeyOf(int shard) {
  for (int i = 0;; ++i) {
    std::string key = absl::StrCat("w", i);
    if (proto::ShardForKey(key, kShards) == shard) return key;
  }
}

class JobAuthorityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/job_authority_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (int s = 0; s < kShards; ++s) {
      ASSERT_NO_FATAL_FAILURE(StartShard(s, "127.0.0.1:0"));
    }
    // Both workers register and take step 0: a checkpoint of step 1 on
    // every shard.
    for (int w = 0; w < 2; ++w) clients_.push_back(Connect(w));
    ASSERT_NE(clients_[0], nullptr);
    ASSERT_NE(clients_[1], nullptr);
    for (int s = 0; s < kShards; ++s) {
      server::Shard& shard = servers_[s]->shard();
      ASSERT_TRUE(shard.store().Init(KeyOf(s), {2}, {1.0f, 2.0f}).ok());
      for (int w = 0; w < 2; ++w) {
        ASSERT_TRUE(shard.store()
                        .Push(w, 0, KeyOf(s), {2}, std::vector<float>{1, 1}, 1)
                        .ok());
      }
      ASSERT_TRUE(shard.FlushCheckpoints().ok());
    }
  }
  void TearDown() override {
    clients_.clear();
    servers_.clear();
    std::system(("rm -rf " + dir_).c_str());
  }

  void StartShard(int s, const std::string& address) {
    server::ShardOptions o;
    o.shard = s;
    o.num_shards = kShards;
    o.num_workers = 2;
    o.worker_loss = policy::WorkerLoss::kWait;
    o.barrier_timeout = absl::Seconds(10);
    o.checkpoint_dir = absl::StrCat(dir_, "/shard", s);
    o.checkpoint_every = 1;
    server::ServerSecurity security;
    security.token = kToken;
    security.per_worker_tokens = true;
    auto r = server::RunningServer::Start(o, address, security);
    ASSERT_TRUE(r.ok()) << r.status();
    if (servers_.size() <= static_cast<size_t>(s)) servers_.resize(s + 1);
    servers_[s] = *std::move(r);
    if (stubs_.size() <= static_cast<size_t>(s)) stubs_.resize(s + 1);
    // Raw calls "as" a token: it goes out as a session of that token.
    stubs_[s] = proto::ParameterServer::NewStub(testing::TokenSessionChannel(
        absl::StrCat("127.0.0.1:", servers_[s]->port()), 2));
  }

  std::unique_ptr<client::GrpcPsClient> Connect(int worker) {
    client::GrpcClientOptions o;
    for (const auto& s : servers_) {
      o.servers.push_back(absl::StrCat("127.0.0.1:", s->port()));
    }
    o.job = "bnps";
    o.worker = worker;
    o.num_workers = 2;
    o.token = security::WorkerToken(kToken, worker);
    o.rpc_timeout = absl::Seconds(10);
    auto c = client::GrpcPsClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  StatusCode Rollback(int shard, const std::string& token,
                      const proto::RollbackRequest& req,
                      proto::RollbackResponse* resp = nullptr) {
    proto::RollbackResponse ignored;
    grpc::ClientContext ctx;
    ctx.AddMetadata(std::string(security::kTokenMetadataKey), token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stubs_[shard]
        ->Rollback(&ctx, req, resp != nullptr ? resp : &ignored)
        .error_code();
  }

  static proto::RollbackRequest Request(int64_t generation) {
    proto::RollbackRequest req;
    req.set_job("bnps");
    req.set_worker(1);
    req.set_generation(generation);
    req.set_step(-1);
    return req;
  }

  int64_t Generation(int shard) {
    return servers_[shard]->shard().generation().generation;
  }

  std::string dir_;
  std::vector<std::unique_ptr<server::RunningServer>> servers_;
  std::vector<std::unique_ptr<proto::ParameterServer::Stub>> stubs_;
  std::vector<std::unique_ptr<client::GrpcPsClient>> clients_;
};

// Nothing failed: worker 1's own token cannot roll the job back, grow it
// past its own place, jump the generation, or hand a shard a membership;
// the job token can (the same request then succeeds).
TEST_F(JobAuthorityTest, AWorkerTokenCannotRollBackResizeOrPushTheGeneration) {
  const std::string one = security::WorkerToken(kToken, 1);
  EXPECT_EQ(Rollback(0, one, Request(1)), StatusCode::PERMISSION_DENIED);
  proto::RollbackRequest grow = Request(1);
  grow.set_resize_to(2);  // its own place, but it is a member already
  EXPECT_EQ(Rollback(0, one, grow), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Rollback(0, one, Request(7)), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Rollback(0, one, Request(proto::kMaxGeneration)),
            StatusCode::PERMISSION_DENIED);
  proto::RollbackRequest adopt = Request(1);
  proto::MembershipSegment* seg = adopt.add_membership();
  seg->set_from_step(0);
  seg->set_num_workers(1);
  adopt.set_warrant("not a seal");
  EXPECT_EQ(Rollback(1, one, adopt), StatusCode::PERMISSION_DENIED);
  // A shard hands no failure warrant when it saw no failure.
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata(std::string(security::kTokenMetadataKey), one);
    proto::StatusRequest req;
    req.set_next_generation(1);
    proto::StatusResponse status;
    ASSERT_TRUE(stubs_[1]->GetStatus(&ctx, req, &status).ok());
    EXPECT_EQ(status.generation_warrant(), "");
  }
  for (int s = 0; s < kShards; ++s) {
    EXPECT_EQ(Generation(s), 0) << "shard " << s;
    EXPECT_FALSE(servers_[s]->shard().generation().needs_rollback);
  }
  // The job token may: the same rollback then succeeds.
  proto::RollbackResponse resp;
  EXPECT_EQ(Rollback(0, kToken, Request(1), &resp), StatusCode::OK);
  EXPECT_EQ(resp.step(), 1);
  EXPECT_EQ(Generation(0), 1);
}

// Worker 1's process is replaced (a restart under --on_worker_loss=wait):
// every shard saw it, so the new process rolls the job back with its own
// token; that failure then moves the job no further.
TEST_F(JobAuthorityTest, AReplacedWorkerRollsTheJobBackWithItsOwnToken) {
  clients_[1].reset();  // the old process is gone
  std::unique_ptr<client::GrpcPsClient> restarted = Connect(1);
  ASSERT_NE(restarted, nullptr);
  ASSERT_TRUE(restarted->rejoining());
  absl::StatusOr<int64_t> step = restarted->Recover(/*restarted=*/true);
  ASSERT_TRUE(step.ok()) << step.status();
  for (int s = 0; s < kShards; ++s) EXPECT_EQ(Generation(s), 1) << "shard " << s;
  const std::string one = security::WorkerToken(kToken, 1);
  EXPECT_EQ(Rollback(0, one, Request(2)), StatusCode::PERMISSION_DENIED);
  absl::StatusOr<int64_t> again = restarted->Recover(/*restarted=*/true);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kPermissionDenied)
      << again.status();
  for (int s = 0; s < kShards; ++s) EXPECT_EQ(Generation(s), 1) << "shard " << s;
}

// Shard 1 restarts from its checkpoint; shard 0 saw nothing. A worker's
// recovery takes shard 1's failure warrant to shard 0, and shard 0's
// decided warrant (with the membership) back to shard 1.
TEST_F(JobAuthorityTest, AShardsRestartLetsAWorkerRollTheJobBack) {
  const std::string address = absl::StrCat("127.0.0.1:", servers_[1]->port());
  servers_[1].reset();
  ASSERT_NO_FATAL_FAILURE(StartShard(1, address));
  ASSERT_TRUE(servers_[1]->shard().generation().needs_rollback);
  const std::string one = security::WorkerToken(kToken, 1);
  // Shard 0 saw no failure: alone, the worker's token cannot move it.
  EXPECT_EQ(Rollback(0, one, Request(1)), StatusCode::PERMISSION_DENIED);
  absl::StatusOr<int64_t> step = clients_[1]->Recover(/*restarted=*/false);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);
  for (int s = 0; s < kShards; ++s) {
    EXPECT_EQ(Generation(s), 1) << "shard " << s;
    EXPECT_FALSE(servers_[s]->shard().generation().needs_rollback);
  }
}

// Worker 1 asks to join a job whose membership counts it already (as when
// another worker's roll-back took it in meanwhile): it joins the
// generation the job is in, where its own token could not start another.
TEST_F(JobAuthorityTest, AWorkerTheJobCountsAlreadyJoinsWithoutANewGeneration) {
  absl::StatusOr<int64_t> step = clients_[1]->Join();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);  // its first step not applied
  for (int s = 0; s < kShards; ++s) EXPECT_EQ(Generation(s), 0) << "shard " << s;
}

}  // namespace
}  // namespace bnps
