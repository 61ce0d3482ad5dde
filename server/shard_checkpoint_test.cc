// Shard checkpoints: taken at step boundaries, restored at start (which
// then needs a rollback), Rollback to a generation, the generation checks,
// and the worker-restart rule of --on_worker_loss=wait.

#include <stdlib.h>

#include <stdio.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/checkpoint.pb.h"
#include "proto/generation.h"
#include "checkpoint/checkpoint.h"
#include "server/shard.h"
#include "server/shard_testing.h"
#include "server/shard_state_codec.h"

namespace bnps::server {
namespace {

using shard_testing::Step;
using shard_testing::Values;

class ShardCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/shard_ckpt_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  ShardOptions Options(int workers = 1,
                       policy::WorkerLoss loss = policy::WorkerLoss::kFail) {
    ShardOptions o;
    o.num_workers = workers;
    o.policy = policy::Policy::kSync;
    o.worker_loss = loss;
    o.start_ticker = false;
    o.checkpoint_dir = dir_;
    o.checkpoint_every = 2;
    return o;
  }

  std::string dir_;
};

TEST_F(ShardCheckpointTest, BoundariesAreWrittenAndRestoredAtStart) {
  std::vector<float> at_4;
  {
    auto shard = *Shard::Create(Options());
    ASSERT_TRUE(shard->Register(0, 7).ok());
    ASSERT_TRUE(*shard->store().Init("w", {2}, {1.0f, 2.0f}));
    for (int64_t s = 0; s < 5; ++s) {
      Step(*shard, s, 0.5f * (s + 1));
      if (s == 3) at_4 = Values(*shard);
    }
    ASSERT_TRUE(shard->FlushCheckpoints().ok());
    EXPECT_EQ(*checkpoint::ListCheckpoints(dir_), (std::vector<int64_t>{4, 2}));
    EXPECT_TRUE(shard->CheckGeneration(0).ok());
  }
  auto restarted = *Shard::Create(Options());
  const Shard::GenerationInfo g = restarted->generation();
  EXPECT_TRUE(g.needs_rollback);
  EXPECT_EQ(g.restored_step, 4);
  EXPECT_EQ(g.generation, 0);
  EXPECT_EQ(Values(*restarted), at_4);
  EXPECT_EQ(restarted->store().GetStats().min_version, 4);
  // The registration came back with the checkpoint.
  EXPECT_TRUE(restarted->membership().Heartbeat(0, 7, absl::Now()).ok());
  // Nothing of the job proceeds before the rollback.
  const absl::Status refused = restarted->CheckGeneration(0);
  EXPECT_TRUE(proto::IsRollback(refused)) << refused;
  EXPECT_NE(refused.message().find("restarted from its checkpoint of step 4"),
            std::string::npos);

  absl::StatusOr<int64_t> step = restarted->Rollback(1, 2);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 2);
  EXPECT_TRUE(restarted->CheckGeneration(1).ok());
  EXPECT_TRUE(proto::IsRollback(restarted->CheckGeneration(0)));
  EXPECT_EQ(restarted->store().GetStats().min_version, 2);
  // Idempotent: the same generation answers the step decided, whatever is
  // asked; an older one is stale.
  EXPECT_EQ(*restarted->Rollback(1, 4), 2);
  EXPECT_EQ(restarted->Rollback(0, 4).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A step without a checkpoint.
  EXPECT_EQ(restarted->Rollback(2, 3).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ShardCheckpointTest, ReplayAfterRollbackGivesTheSameBits) {
  std::vector<float> final_values;
  auto shard = *Shard::Create(Options());
  ASSERT_TRUE(*shard->store().Init("w", {2}, {1.0f, 2.0f}));
  for (int64_t s = 0; s < 6; ++s) Step(*shard, s, 0.25f * (s + 1));
  final_values = Values(*shard);
  ASSERT_TRUE(shard->FlushCheckpoints().ok());
  // A pull waiting for a version the rollback takes away fails with it.
  absl::Status waited;
  shard->store().Pull({"w"}, 7, absl::InfiniteFuture(),
                      [&](absl::StatusOr<store::ParameterStore::Snapshot> s) {
                        waited = s.status();
                      });
  absl::StatusOr<int64_t> rolled = shard->Rollback(1, 2);
  ASSERT_TRUE(rolled.ok()) << rolled.status();
  EXPECT_TRUE(proto::IsRollback(waited)) << waited;
  // Steps 2..5 again, as the workers replay them.
  for (int64_t s = 2; s < 6; ++s) Step(*shard, s, 0.25f * (s + 1));
  EXPECT_EQ(Values(*shard), final_values);  // bit for bit
}

// A checkpoint that verifies (its checksum is right) but whose content does
// not fit the job must change nothing when a rollback to it fails: not the
// parameters (half a restore) and not the generation checks.
TEST_F(ShardCheckpointTest, AFailedRollbackLeavesTheStateAsItWas) {
  auto shard = *Shard::Create(Options());
  ASSERT_TRUE(*shard->store().Init("w", {2}, {1.0f, 2.0f}));
  for (int64_t s = 0; s < 4; ++s) Step(*shard, s, 0.25f * (s + 1));
  ASSERT_TRUE(shard->FlushCheckpoints().ok());
  const std::vector<float> before = Values(*shard);
  absl::StatusOr<checkpoint::CheckpointFile> file =
      checkpoint::ReadCheckpoint(checkpoint::CheckpointPath(dir_, 2));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<proto::ShardCheckpoint> decoded =
      DecodeShardState(file->payload, file->path);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  proto::ShardCheckpoint c = *decoded;
  ASSERT_EQ(c.params_size(), 1);
  proto::BnLayerState* l = c.add_bn_layers();
  l->set_layer("bn0");
  l->set_channels(3);
  l->set_has_running(true);
  l->set_running_mean(std::string(2 * sizeof(double), '\0'));  // not 3
  l->set_running_var(std::string(2 * sizeof(double), '\0'));
  ASSERT_TRUE(checkpoint::WriteCheckpoint(dir_, 2, *EncodeShardState(c)).ok());

  absl::StatusOr<int64_t> rolled = shard->Rollback(1, 2);
  EXPECT_TRUE(absl::IsDataLoss(rolled.status())) << rolled.status();
  EXPECT_EQ(Values(*shard), before);  // not step 2's parameters
  // Set aside, as a torn file: the workers' next try picks another step.
  EXPECT_EQ(*checkpoint::ListCheckpoints(dir_), (std::vector<int64_t>{4}));
  EXPECT_TRUE(shard->CheckGeneration(0).ok());
  EXPECT_EQ(shard->generation().generation, 0);
  Step(*shard, 4, 1.0f);  // the job goes on where it was
}

// A checkpoint whose clocks cannot be restored (async, shard 0: over the
// staleness bound) must not leave the parameters restored and the clocks not.
TEST_F(ShardCheckpointTest, AHalfRestoredShardRefusesCalls) {
  ShardOptions o = Options(2);
  o.policy = policy::Policy::kAsync;
  o.staleness = 1;
  o.checkpoint_every = 0;
  auto shard = *Shard::Create(o);
  ASSERT_TRUE(*shard->store().Init("w", {2}, {1.0f, 2.0f}));
  ASSERT_TRUE(shard->store().Push(0, 0, "w", {2}, std::vector<float>{1, 1}, 1).ok());
  ASSERT_TRUE(shard->CheckpointNow().ok());
  const std::vector<float> before = Values(*shard);
  absl::StatusOr<std::vector<int64_t>> steps = checkpoint::ListCheckpoints(dir_);
  ASSERT_TRUE(steps.ok() && !steps->empty());
  absl::StatusOr<checkpoint::CheckpointFile> file =
      checkpoint::ReadCheckpoint(checkpoint::CheckpointPath(dir_, steps->front()));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<proto::ShardCheckpoint> decoded =
      DecodeShardState(file->payload, file->path);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  proto::ShardCheckpoint c = *decoded;
  ASSERT_EQ(c.workers_size(), 2);
  ASSERT_EQ(c.params_size(), 1);
  c.mutable_params(0)->set_values(std::string(2 * sizeof(float), '\0'));
  c.mutable_workers(0)->set_clock(5);  // 5 steps ahead of worker 1: over s
  ASSERT_TRUE(checkpoint::WriteCheckpoint(dir_, steps->front(), *EncodeShardState(c)).ok());

  absl::StatusOr<int64_t> rolled = shard->Rollback(1, -1);
  EXPECT_FALSE(rolled.ok());
  // The clocks are checked before the parameters change: nothing changed,
  // and the job goes on in its generation.
  EXPECT_EQ(Values(*shard), before);
  EXPECT_TRUE(shard->CheckGeneration(0).ok());
  EXPECT_FALSE(shard->generation().needs_rollback);
}

// Tensors are records of their own beside one bounded message, so a state
// far over the message limit (here lowered to 1 KiB, standing for protobuf's
// 2 GiB) is written and restored; an older server's one-message payload
// still restores.
TEST_F(ShardCheckpointTest, AStateOfAnySizeRoundTrips) {
  ShardOptions o = Options();
  o.checkpoint_max_message_bytes = 1024;
  std::vector<float> init(100000);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.001f * i;
  std::vector<float> at_2;
  {
    auto shard = *Shard::Create(o);
    ASSERT_TRUE(*shard->store().Init("w", {100, 1000}, init));
    for (int64_t s = 0; s < 3; ++s) {
      std::vector<float> g(init.size(), 0.25f * (s + 1));
      ASSERT_TRUE(shard->store().Push(0, s, "w", {100, 1000}, g, 1).ok());
      if (s == 1) at_2 = Values(*shard);
    }
    ASSERT_TRUE(shard->FlushCheckpoints().ok());
  }
  absl::StatusOr<checkpoint::CheckpointFile> file =
      checkpoint::ReadCheckpoint(checkpoint::CheckpointPath(dir_, 2));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_GT(file->payload.size(), 2 * init.size() * sizeof(float));
  {
    auto restarted = *Shard::Create(o);
    EXPECT_EQ(restarted->generation().restored_step, 2);
    EXPECT_EQ(Values(*restarted), at_2);
  }
  // The same state as one message, as a server of before wrote it.
  absl::StatusOr<proto::ShardCheckpoint> c = DecodeShardState(file->payload, "test");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(checkpoint::WriteCheckpoint(dir_, 2, c->SerializeAsString()).ok());
  auto restarted = *Shard::Create(Options());
  EXPECT_EQ(restarted->generation().restored_step, 2);
  EXPECT_EQ(Values(*restarted), at_2);
}

// A directory that cannot be written for two boundaries, then can: the
// failures are reported, and the final checkpoint, written, reports OK (the
// first error no longer sticks, which made the server exit 1 and a JobSet
// restart a finished job). As root, chmod 555 does not stop a write: the
// directory is replaced by a file for the two boundaries instead.
TEST_F(ShardCheckpointTest, AFailedWriteDoesNotPoisonTheFinalOne) {
  absl::Status said = absl::UnknownError("not called");
  ShardOptions o = Options(2);
  o.on_job_complete = [&](const absl::Status& s) { said = s; };
  auto shard = *Shard::Create(o);
  ASSERT_TRUE(shard->Register(0, 7).ok());
  ASSERT_TRUE(shard->Register(1, 8).ok());
  ASSERT_TRUE(*shard->store().Init("w", {2}, {1.0f, 2.0f}));
  Step(*shard, 0, 0.5f);
  Step(*shard, 1, 0.5f);
  ASSERT_TRUE(shard->FlushCheckpoints().ok());
  const std::string away = dir_ + ".away";
  ASSERT_EQ(::rename(dir_.c_str(), away.c_str()), 0);
  { std::ofstream block(dir_); }
  testing::internal::CaptureStderr();
  Step(*shard, 2, 0.5f);
  Step(*shard, 3, 0.5f);
  const absl::Status failed = shard->FlushCheckpoints();
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(log.find("checkpoint of step 4 failed"), std::string::npos) << log;
  ASSERT_EQ(::unlink(dir_.c_str()), 0);
  ASSERT_EQ(::rename(away.c_str(), dir_.c_str()), 0);
  Step(*shard, 4, 0.5f);
  ASSERT_TRUE(shard->Leave(0, 7).ok());
  ASSERT_TRUE(shard->Leave(1, 8).ok());
  ASSERT_TRUE(shard->job_complete());
  EXPECT_TRUE(said.ok()) << said;
  EXPECT_EQ(*checkpoint::ListCheckpoints(dir_), (std::vector<int64_t>{5, 2}));
}

TEST_F(ShardCheckpointTest, ASecondServerOnTheDirectoryIsRefused) {
  auto first = *Shard::Create(Options());
  absl::StatusOr<std::unique_ptr<Shard>> second = Shard::Create(Options());
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another server"),
            std::string::npos)
      << second.status();
  first.reset();
  EXPECT_TRUE(Shard::Create(Options()).ok());
}

TEST_F(ShardCheckpointTest, TheDirectoryIsCreatedAtStartOrTheStartFails) {
  // Missing parents are created (bnps_launch.py --restart=on-failure passes
  // <out_dir>/checkpoints/shard<i>, whose parent nothing else creates).
  ShardOptions o = Options();
  o.checkpoint_dir = dir_ + "/checkpoints/shard0";
  {
    auto shard = *Shard::Create(o);
    ASSERT_TRUE(*shard->store().Init("w", {2}, {1.0f, 2.0f}));
    for (int64_t s = 0; s < 2; ++s) Step(*shard, s, 1.0f);
    ASSERT_TRUE(shard->FlushCheckpoints().ok());
    EXPECT_EQ(*checkpoint::ListCheckpoints(o.checkpoint_dir), (std::vector<int64_t>{2}));
  }
  // A directory that cannot be made fails the start, not every checkpoint
  // while the job runs without any to come back to.
  ASSERT_TRUE(checkpoint::WriteCheckpoint(dir_ + "/d", 0, "x").ok());
  o.checkpoint_dir = checkpoint::CheckpointPath(dir_ + "/d", 0) + "/sub";  // under a file
  absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(o);
  EXPECT_TRUE(absl::IsFailedPrecondition(shard.status())) << shard.status();
}

TEST_F(ShardCheckpointTest, AtStartAFileThatDoesNotFitFallsBack) {
  {
    auto shard = *Shard::Create(Options());
    ASSERT_TRUE(*shard->store().Init("w", {2}, {1.0f, 2.0f}));
    for (int64_t s = 0; s < 4; ++s) Step(*shard, s, 0.5f);
    ASSERT_TRUE(shard->FlushCheckpoints().ok());
  }
  // Step 4's file verifies (its checksum is right) but is no checkpoint.
  ASSERT_TRUE(checkpoint::WriteCheckpoint(dir_, 4, "\xff\xff\xff").ok());
  absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(Options());
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ((*shard)->generation().restored_step, 2);
  EXPECT_EQ(*checkpoint::ListCheckpoints(dir_), (std::vector<int64_t>{2}));
}

TEST_F(ShardCheckpointTest, RefusesACheckpointOfAnotherJob) {
  {
    auto shard = *Shard::Create(Options());
    ASSERT_TRUE(*shard->store().Init("w", {2}, {1.0f, 2.0f}));
    Step(*shard, 0, 1.0f);
    Step(*shard, 1, 1.0f);
    ASSERT_TRUE(shard->FlushCheckpoints().ok());
  }
  ShardOptions other = Options();
  other.optimizer.learning_rate = 0.5;
  absl::StatusOr<std::unique_ptr<Shard>> s = Shard::Create(other);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("another job configuration"),
            std::string::npos)
      << s.status();
}

TEST_F(ShardCheckpointTest, CheckpointNeedsADirectory) {
  ShardOptions o = Options();
  o.checkpoint_dir.clear();
  EXPECT_EQ(Shard::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.checkpoint_every = 0;
  auto shard = *Shard::Create(o);
  EXPECT_EQ(shard->CheckpointNow().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->Rollback(1, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ShardCheckpointTest, UnderWaitARestartedWorkerTakesThePlace) {
  auto shard = *Shard::Create(Options(2, policy::WorkerLoss::kWait));
  ASSERT_TRUE(shard->Register(0, 11).ok());
  ASSERT_TRUE(shard->Register(1, 21).ok());
  ASSERT_TRUE(*shard->store().Init("w", {2}, {1.0f, 2.0f}));
  Step(*shard, 0, 1.0f);
  EXPECT_TRUE(shard->TookPart(1));
  ASSERT_TRUE(shard->Register(1, 22).ok());  // the restarted process
  EXPECT_TRUE(shard->membership().Heartbeat(1, 22, absl::Now()).ok());
  EXPECT_FALSE(shard->membership().Heartbeat(1, 21, absl::Now()).ok());
  // Under fail, the same is a second process: refused.
  ShardOptions strict_options = Options(2, policy::WorkerLoss::kFail);
  strict_options.checkpoint_dir = dir_ + "/strict";  // one server a directory
  auto strict = *Shard::Create(strict_options);
  ASSERT_TRUE(strict->Register(1, 21).ok());
  EXPECT_EQ(strict->Register(1, 22).code(), absl::StatusCode::kFailedPrecondition);
  // A worker that finished does not come back, not even under wait.
  ASSERT_TRUE(shard->Leave(0, 11).ok());
  EXPECT_EQ(shard->Register(0, 12).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(shard->membership().Snapshot()[0].finished);
}

// The end of the job: once every worker left, the shard writes a final
// checkpoint of the final step (here 5, between the boundaries 4 and 6),
// calls on_job_complete once, and refuses registrations; a shard started
// from it is complete at once, needs no rollback, and holds the final bits.
TEST_F(ShardCheckpointTest, TheLastLeaveWritesAFinalCheckpoint) {
  std::vector<float> final_values;
  int completions = 0;
  absl::Status said = absl::UnknownError("not called");
  {
    ShardOptions o = Options(2);
    o.on_job_complete = [&](const absl::Status& s) {
      ++completions;
      said = s;
    };
    auto shard = *Shard::Create(o);
    ASSERT_TRUE(shard->Register(0, 7).ok());
    ASSERT_TRUE(shard->Register(1, 8).ok());
    ASSERT_TRUE(*shard->store().Init("w", {2}, {1.0f, 2.0f}));
    for (int64_t s = 0; s < 5; ++s) Step(*shard, s, 0.5f * (s + 1));
    final_values = Values(*shard);
    ASSERT_TRUE(shard->Leave(0, 7).ok());
    EXPECT_FALSE(shard->job_complete());
    EXPECT_EQ(completions, 0);
    EXPECT_EQ(shard->Leave(1, 9).code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(shard->Leave(1, 8).ok());
    EXPECT_TRUE(shard->job_complete());
    EXPECT_EQ(completions, 1);
    EXPECT_TRUE(said.ok()) << said;
    ASSERT_TRUE(shard->Leave(1, 8).ok());  // a retry completes nothing again
    EXPECT_EQ(completions, 1);
    EXPECT_EQ(*checkpoint::ListCheckpoints(dir_), (std::vector<int64_t>{5, 4, 2}));
    EXPECT_EQ(shard->Register(1, 10).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  auto restarted = *Shard::Create(Options(2));
  EXPECT_TRUE(restarted->job_complete());
  const Shard::GenerationInfo g = restarted->generation();
  EXPECT_FALSE(g.needs_rollback);
  EXPECT_EQ(g.restored_step, 5);
  EXPECT_EQ(Values(*restarted), final_values);
  EXPECT_TRUE(restarted->membership().Snapshot()[1].finished);
  const absl::Status join = restarted->Register(0, 11);
  EXPECT_EQ(join.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(join.message().find("is complete"), std::string::npos) << join;
}

// Under shrink, a job whose other workers finished completes when the last
// one is dropped.
TEST_F(ShardCheckpointTest, UnderShrinkADroppedWorkerDoesNotHoldTheEndBack) {
  ShardOptions o = Options(2, policy::WorkerLoss::kShrink);
  o.heartbeat_timeout = absl::Seconds(1);
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  o.now = [t0] { return t0; };
  auto shard = *Shard::Create(o);
  ASSERT_TRUE(shard->Register(0, 7).ok());
  ASSERT_TRUE(shard->Register(1, 8).ok());
  ASSERT_TRUE(shard->Leave(0, 7).ok());
  shard->Tick(t0 + absl::Milliseconds(500));
  EXPECT_FALSE(shard->job_complete());
  shard->Tick(t0 + absl::Seconds(2));  // worker 1 is dropped
  EXPECT_TRUE(shard->job_complete());
}

}  // namespace
}  // namespace bnps::server
