// The batcher alone: rounds held until the host's workers are all in, one
// frame in worker order, the answers handed back, and the failures.

#include "hostbn/batcher.h"

#include "gtest/gtest.h"

namespace bnps::hostbn {
namespace {

proto::BnRequest Req(int worker, uint64_t id, proto::BnPhase phase,
                     int64_t step = 0, const std::string& layer = "bn1") {
  proto::BnRequest r;
  r.set_id(id);
  r.set_job("bnps");
  r.set_worker(worker);
  r.set_step(step);
  r.set_layer(layer);
  r.set_phase(phase);
  return r;
}

// The shard's answer to `frame`: entry i gets code 0 and contributors i.
proto::BnResponse AnswerAll(const proto::BnRequest& frame) {
  proto::BnResponse resp;
  resp.set_id(frame.id());
  for (int i = 0; i < frame.batch_size(); ++i) {
    proto::BnResponse* e = resp.add_batch();
    e->set_id(frame.batch(i).id());
    e->set_contributors(100 + i);
  }
  return resp;
}

TEST(BatcherTest, ARoundLeavesAsOneFrameInWorkerOrderOnceAllAreIn) {
  Batcher b(3);
  for (int w : {0, 1, 2}) b.Join(w);
  Batcher::Out out = b.Submit(2, Req(2, 20, proto::BN_FORWARD));
  EXPECT_TRUE(out.upstream.empty());
  out = b.Submit(0, Req(0, 5, proto::BN_FORWARD));
  EXPECT_TRUE(out.upstream.empty());
  // Another round does not mix with this one.
  EXPECT_TRUE(b.Submit(1, Req(1, 9, proto::BN_FORWARD, 0, "bn2")).upstream.empty());
  EXPECT_EQ(b.held(), 2);
  out = b.Submit(1, Req(1, 7, proto::BN_FORWARD));
  ASSERT_EQ(out.upstream.size(), 1u);
  const proto::BnRequest& frame = out.upstream[0];
  ASSERT_EQ(frame.batch_size(), 3);
  EXPECT_EQ(frame.batch(0).worker(), 0);
  EXPECT_EQ(frame.batch(1).worker(), 1);
  EXPECT_EQ(frame.batch(2).worker(), 2);
  EXPECT_EQ(frame.batch(2).id(), 20u);
  EXPECT_TRUE(frame.layer().empty());
  EXPECT_EQ(b.held(), 1);

  auto answers = b.Answer(AnswerAll(frame));
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].first, 0);
  EXPECT_EQ(answers[0].second.id(), 5u);
  EXPECT_EQ(answers[2].first, 2);
  EXPECT_EQ(answers[2].second.id(), 20u);
  EXPECT_EQ(answers[2].second.contributors(), 102);
  // Answered once: a second copy of the shard's answer goes nowhere.
  EXPECT_TRUE(b.Answer(AnswerAll(frame)).empty());
}

TEST(BatcherTest, RequestsThatAnswerAtOnceAndRepeatsLeaveAlone) {
  Batcher b(2);
  Batcher::Out out = b.Submit(0, Req(0, 1, proto::BN_RUNNING));
  ASSERT_EQ(out.upstream.size(), 1u);
  EXPECT_EQ(out.upstream[0].batch_size(), 1);
  out = b.Submit(0, Req(0, 2, proto::BN_RECAL));
  ASSERT_EQ(out.upstream.size(), 1u);

  ASSERT_TRUE(b.Submit(0, Req(0, 3, proto::BN_BACKWARD, 4)).upstream.empty());
  // The same worker again for a held round (a repeat after a reconnection).
  out = b.Submit(0, Req(0, 4, proto::BN_BACKWARD, 4));
  ASSERT_EQ(out.upstream.size(), 1u);
  EXPECT_EQ(out.upstream[0].batch_size(), 1);
  ASSERT_EQ(b.Submit(1, Req(1, 5, proto::BN_BACKWARD, 4)).upstream.size(), 1u);
  // A repeat of a round already sent.
  out = b.Submit(1, Req(1, 6, proto::BN_BACKWARD, 4));
  ASSERT_EQ(out.upstream.size(), 1u);
  EXPECT_EQ(out.upstream[0].batch_size(), 1);
}

TEST(BatcherTest, AWorkerThatLeftHoldsUpNoRoundUntilItComesBack) {
  Batcher b(3);
  for (int w : {0, 1, 2}) b.Join(w);
  ASSERT_TRUE(b.Submit(0, Req(0, 1, proto::BN_FORWARD)).upstream.empty());
  ASSERT_TRUE(b.Submit(1, Req(1, 2, proto::BN_FORWARD)).upstream.empty());
  // Worker 1 leaves after contributing: the round still waits for 2.
  Batcher::Out out = b.Leave(1);
  EXPECT_TRUE(out.upstream.empty());
  EXPECT_TRUE(out.answers.empty());
  // Worker 2 leaves without contributing: the round leaves without it (the
  // shard waits for it or fails the barrier naming it).
  out = b.Leave(2);
  EXPECT_TRUE(out.answers.empty());
  ASSERT_EQ(out.upstream.size(), 1u);
  ASSERT_EQ(out.upstream[0].batch_size(), 2);
  EXPECT_EQ(out.upstream[0].batch(0).worker(), 0);
  EXPECT_EQ(out.upstream[0].batch(1).worker(), 1);
  EXPECT_EQ(b.held(), 0);
  // Later rounds wait for those present alone.
  out = b.Submit(0, Req(0, 3, proto::BN_FORWARD, 1));
  ASSERT_EQ(out.upstream.size(), 1u);
  EXPECT_EQ(out.upstream[0].batch_size(), 1);
  // Worker 2 comes back and repeats the first round's request: it goes
  // alone (the others' left already); new rounds wait for it again.
  b.Join(2);
  out = b.Submit(2, Req(2, 5, proto::BN_FORWARD));
  ASSERT_EQ(out.upstream.size(), 1u);
  EXPECT_EQ(out.upstream[0].batch_size(), 1);
  EXPECT_TRUE(b.Submit(0, Req(0, 6, proto::BN_FORWARD, 2)).upstream.empty());
  EXPECT_EQ(b.Submit(2, Req(2, 7, proto::BN_FORWARD, 2)).upstream.size(), 1u);
}

TEST(BatcherTest, RoundsHeldAreBounded) {
  Batcher b(2);
  for (int step = 0; step < Batcher::kMaxHeldRounds; ++step) {
    ASSERT_TRUE(b.Submit(0, Req(0, step, proto::BN_FORWARD, step)).answers.empty());
  }
  Batcher::Out out =
      b.Submit(0, Req(0, 99999, proto::BN_FORWARD, Batcher::kMaxHeldRounds));
  ASSERT_EQ(out.answers.size(), 1u);
  EXPECT_EQ(out.answers[0].second.code(),
            static_cast<int>(absl::StatusCode::kResourceExhausted));
  // A round already held still completes.
  EXPECT_EQ(b.Submit(1, Req(1, 7, proto::BN_FORWARD, 0)).upstream.size(), 1u);
}

TEST(BatcherTest, AFailedBatchOrABrokenShardAnswersEveryEntry) {
  Batcher b(2);
  ASSERT_TRUE(b.Submit(0, Req(0, 1, proto::BN_FORWARD)).upstream.empty());
  Batcher::Out out = b.Submit(1, Req(1, 2, proto::BN_FORWARD));
  ASSERT_EQ(out.upstream.size(), 1u);
  proto::BnResponse refused;
  refused.set_id(out.upstream[0].id());
  refused.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
  refused.set_message("no");
  auto answers = b.Answer(refused);
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[1].second.id(), 2u);
  EXPECT_EQ(answers[1].second.code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));

  ASSERT_TRUE(b.Submit(0, Req(0, 3, proto::BN_FORWARD, 1)).upstream.empty());
  ASSERT_EQ(b.Submit(0, Req(0, 4, proto::BN_RUNNING)).upstream.size(), 1u);
  out = b.Fail(absl::UnavailableError("the shard went away"));
  ASSERT_EQ(out.answers.size(), 2u);  // the held one and the outstanding one
  EXPECT_EQ(b.held(), 0);
}

}  // namespace
}  // namespace bnps::hostbn
