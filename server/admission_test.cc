#include "server/admission.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "proto/generation.h"
#include "proto/sharding.h"
#include "server/shard.h"
#include "server/shard_testing.h"

namespace bnps::server {
namespace {

std::unique_ptr<Shard> NewShard(int shard = 0, int num_shards = 1,
                                std::string checkpoint_dir = "") {
  ShardOptions o;
  o.num_workers = 3;
  o.shard = shard;
  o.num_shards = num_shards;
  o.start_ticker = false;
  o.checkpoint_dir = std::move(checkpoint_dir);
  absl::StatusOr<std::unique_ptr<Shard>> s = Shard::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

AdmissionRequest Worker(int worker, int caller = Shard::kAnyWorker) {
  AdmissionRequest a;
  a.caller = caller;
  a.job = "bnps";
  a.worker = worker;
  return a;
}

TEST(AdmissionTest, ChecksJobWorkerAndCaller) {
  auto shard = NewShard();
  absl::StatusOr<Admission> ok = shard->Admit(Worker(2));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->worker(), 2);

  AdmissionRequest other = Worker(1);
  other.job = "other";
  absl::Status s = shard->Admit(other).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "request for job 'other' reached a server of job 'bnps'");
  s = shard->Admit(Worker(3)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "worker 3 outside the job's [0, 3)");
  s = shard->Admit(Worker(1, /*caller=*/0)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("may not act as worker 1"), std::string::npos);
  EXPECT_TRUE(shard->Admit(Worker(1, /*caller=*/1)).ok());
}

TEST(AdmissionTest, AJobWithoutAWorkerChecksTheJobOnly) {
  auto shard = NewShard();
  AdmissionRequest read;
  read.caller = 2;  // a worker's token may read
  read.job = "bnps";
  EXPECT_TRUE(shard->Admit(read).ok());
  read.job = "other";
  EXPECT_EQ(shard->Admit(read).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(shard->Admit(AdmissionRequest()).ok());  // names nothing
  EXPECT_EQ(shard->Admit(AdmissionRequest())->worker(), -1);
}

TEST(AdmissionTest, RegisteredWorkersOnlyWhereAsked) {
  auto shard = NewShard();
  AdmissionRequest bn = Worker(1);
  bn.registered = true;
  absl::Status s = shard->Admit(bn).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("has not registered"), std::string::npos);
  ASSERT_TRUE(shard->Register(1, 7).ok());
  EXPECT_TRUE(shard->Admit(bn).ok());
}

TEST(AdmissionTest, KeysMustBeTheShards) {
  auto shard = NewShard(/*shard=*/1, /*num_shards=*/2);
  std::vector<std::string> mine, theirs;
  for (int i = 0; i < 20; ++i) {
    const std::string key = "param/" + std::to_string(i);
    (proto::ShardForKey(key, 2) == 1 ? mine : theirs).push_back(key);
  }
  ASSERT_FALSE(mine.empty());
  ASSERT_FALSE(theirs.empty());
  AdmissionRequest a = Worker(0);
  a.keys = mine;
  EXPECT_TRUE(shard->Admit(a).ok());
  std::vector<std::string> both = {mine[0], theirs[0]};
  a.keys = both;
  absl::Status s = shard->Admit(a).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("belongs to shard 0"), std::string::npos);
}

TEST(AdmissionTest, OneLiveConnectionPerWorkerAndTransport) {
  auto shard = NewShard();
  AdmissionRequest tcp = Worker(1, /*caller=*/1);
  tcp.connection = BnTransport::kTcp;
  absl::StatusOr<Admission> first = shard->Admit(tcp);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::Status s = shard->Admit(tcp).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "worker 1 already has a live BN connection to shard 0 "
            "(per-worker tokens; generation 0, this one's 0, the shard's 0)");
  // The other transport has claims of its own.
  AdmissionRequest stream;
  stream.caller = 1;
  stream.connection = BnTransport::kStream;
  absl::StatusOr<Admission> on_stream = shard->Admit(stream);
  ASSERT_TRUE(on_stream.ok());
  s = shard->Admit(stream).status();
  EXPECT_NE(s.message().find("already has a live BN stream"),
            std::string::npos);
  // A moved admission keeps the claim; releasing it frees the worker.
  Admission held = *std::move(first);
  EXPECT_FALSE(shard->Admit(tcp).ok());
  held.Release();
  EXPECT_TRUE(shard->Admit(tcp).ok());  // and the temporary lets go again
  EXPECT_TRUE(shard->Admit(tcp).ok());
  // The job token (any worker) holds no claim.
  tcp.caller = Shard::kAnyWorker;
  absl::StatusOr<Admission> any1 = shard->Admit(tcp);
  absl::StatusOr<Admission> any2 = shard->Admit(tcp);
  EXPECT_TRUE(any1.ok());
  EXPECT_TRUE(any2.ok());
}

// After a rollback the worker's connection for the new generation may
// reach the shard before its old one ended: it takes the claim over, and
// the old one's end leaves it alone.
TEST(AdmissionTest, AConnectionOfTheNewGenerationSupersedesAnOldOne) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ShardOptions o;
  o.num_workers = 3;
  o.policy = policy::Policy::kSync;
  o.start_ticker = false;
  o.checkpoint_dir =
      std::string(tmp != nullptr ? tmp : "/tmp") + "/admission_supersede";
  o.checkpoint_every = 1;
  std::unique_ptr<Shard> shard = *Shard::Create(o);
  ASSERT_TRUE(*shard->store().Init("w", {2}, {1.0f, 2.0f}));
  shard_testing::Step(*shard, 0, 0.5f);
  ASSERT_TRUE(shard->FlushCheckpoints().ok());
  AdmissionRequest old_stream;
  old_stream.caller = 1;
  old_stream.connection = BnTransport::kStream;
  old_stream.connection_generation = 0;
  absl::StatusOr<Admission> old_one = shard->Admit(old_stream);
  ASSERT_TRUE(old_one.ok()) << old_one.status();
  AdmissionRequest new_stream = old_stream;
  new_stream.connection_generation = 1;
  // Not before the shard is in generation 1.
  EXPECT_EQ(shard->Admit(new_stream).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<int64_t> rolled = shard->Rollback(1, 1);
  ASSERT_TRUE(rolled.ok()) << rolled.status();
  absl::StatusOr<Admission> new_one = shard->Admit(new_stream);
  ASSERT_TRUE(new_one.ok()) << new_one.status();
  // Neither a second one of generation 1, nor one of a later generation.
  EXPECT_EQ(shard->Admit(new_stream).status().code(),
            absl::StatusCode::kFailedPrecondition);
  new_stream.connection_generation = 2;
  EXPECT_EQ(shard->Admit(new_stream).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // One of a past generation is told the job rolled on.
  new_stream.connection_generation = 0;
  absl::Status past = shard->Admit(new_stream).status();
  EXPECT_TRUE(proto::IsRollback(past)) << past;
  new_stream.connection_generation = 1;
  // The old connection ends: the new one keeps its claim.
  old_one->Release();
  EXPECT_EQ(shard->Admit(new_stream).status().code(),
            absl::StatusCode::kFailedPrecondition);
  new_one->Release();
  EXPECT_TRUE(shard->Admit(new_stream).ok());
}

TEST(AdmissionTest, ChecksTheGenerationLastAndLetsGoOnFailure) {
  auto shard = NewShard();
  AdmissionRequest a = Worker(1, /*caller=*/1);
  a.connection = BnTransport::kTcp;
  a.generation = 4;
  absl::Status s = shard->Admit(a).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(proto::IsRollback(s)) << s;
  a.job = "other";  // both wrong: the job is said
  EXPECT_EQ(shard->Admit(a).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The refused admission gave its claim back.
  a.job = "bnps";
  a.generation = 0;
  EXPECT_TRUE(shard->Admit(a).ok());
}

TEST(AdmissionTest, AGenerationCheckedAdmissionHoldsOffRollbacks) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  auto shard = NewShard(0, 1, std::string(tmp != nullptr ? tmp : "/tmp") +
                                  "/admission_rollback");
  AdmissionRequest a = Worker(0);
  a.generation = 0;
  absl::StatusOr<Admission> admitted = shard->Admit(a);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  std::atomic<bool> released{false};
  std::atomic<bool> rolled_back_after_release{false};
  std::thread rollback([&] {
    (void)shard->Rollback(1, -1);  // no checkpoint: its error does not matter
    rolled_back_after_release = released.load();
  });
  released = true;
  admitted->Release();
  rollback.join();
  EXPECT_TRUE(rolled_back_after_release);
}

}  // namespace
}  // namespace bnps::server
