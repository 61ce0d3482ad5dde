#include "server/rollback_authority.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "proto/generation.h"
#include "security/worker_token.h"

namespace bnps::server {
namespace {

constexpr char kKey[] = "job-token-0123456789abcdef";
constexpr char kJob[] = "bnps";
constexpr int kAny = security::TokenAuthenticator::kAnyWorker;

proto::RollbackRequest Request(int64_t generation) {
  proto::RollbackRequest req;
  req.set_job(kJob);
  req.set_worker(1);
  req.set_generation(generation);
  req.set_step(-1);
  return req;
}

absl::StatusCode Check(int caller, const RollbackGrounds& g,
                       const proto::RollbackRequest& req) {
  return CheckRollbackAuthority(kKey, kJob, caller, g, req).code();
}

TEST(RollbackAuthorityTest, BoundsHoldForEveryCaller) {
  RollbackGrounds g;
  for (int caller : {kAny, 1}) {
    EXPECT_EQ(Check(caller, g, Request(-1)), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Check(caller, g, Request(proto::kMaxGeneration + 1)),
              absl::StatusCode::kInvalidArgument);
    proto::RollbackRequest req = Request(1);
    req.set_step(-2);
    EXPECT_EQ(Check(caller, g, req), absl::StatusCode::kInvalidArgument);
  }
}

TEST(RollbackAuthorityTest, TheJobTokenMayStartAnyGeneration) {
  RollbackGrounds g;
  g.generation = 3;
  proto::RollbackRequest req = Request(proto::kMaxGeneration);
  req.set_resize_to(7);
  req.add_membership()->set_num_workers(2);
  EXPECT_EQ(Check(kAny, g, req), absl::StatusCode::kOk);
}

TEST(RollbackAuthorityTest, AWorkerAloneCannotStartAGeneration) {
  RollbackGrounds g;
  g.generation = 3;
  EXPECT_EQ(Check(1, g, Request(4)), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Check(1, g, Request(5)), absl::StatusCode::kPermissionDenied);
  proto::RollbackRequest grow = Request(4);
  grow.set_resize_to(2);  // its own place, but it is not joining
  EXPECT_EQ(Check(1, g, grow), absl::StatusCode::kPermissionDenied);
  grow.set_resize_to(3);  // another's place
  g.caller_joins = true;
  EXPECT_EQ(Check(1, g, grow), absl::StatusCode::kPermissionDenied);
  proto::RollbackRequest adopt = Request(4);
  adopt.add_membership()->set_num_workers(2);
  EXPECT_EQ(Check(1, g, adopt), absl::StatusCode::kPermissionDenied);
  // Asking for what is decided already starts nothing: the shard answers.
  EXPECT_EQ(Check(1, g, Request(3)), absl::StatusCode::kOk);
  EXPECT_EQ(Check(1, g, Request(2)), absl::StatusCode::kOk);
}

TEST(RollbackAuthorityTest, AFailureTheShardSawAllowsTheNextGenerationOnly) {
  RollbackGrounds g;
  g.generation = 3;
  g.failure_seen = true;
  EXPECT_EQ(Check(1, g, Request(4)), absl::StatusCode::kOk);
  EXPECT_EQ(Check(1, g, Request(5)), absl::StatusCode::kPermissionDenied);
  g.failure_seen = false;
  g.needs_rollback = true;  // restarted: may have missed generations
  EXPECT_EQ(Check(1, g, Request(3)), absl::StatusCode::kOk);
  EXPECT_EQ(Check(1, g, Request(3 + kMaxGenerationsBehind)),
            absl::StatusCode::kOk);
  EXPECT_EQ(Check(1, g, Request(4 + kMaxGenerationsBehind)),
            absl::StatusCode::kPermissionDenied);
}

TEST(RollbackAuthorityTest, AWorkerTakesOrGivesUpItsOwnPlace) {
  RollbackGrounds g;
  g.generation = 3;
  g.caller_joins = true;
  proto::RollbackRequest join = Request(4);
  join.set_resize_to(2);
  EXPECT_EQ(Check(1, g, join), absl::StatusCode::kOk);
  g.caller_joins = false;
  proto::RollbackRequest leave = Request(4);
  leave.set_shrink_to(1);
  EXPECT_EQ(Check(1, g, leave), absl::StatusCode::kOk);
  leave.set_shrink_to(2);
  EXPECT_EQ(Check(1, g, leave), absl::StatusCode::kPermissionDenied);
}

TEST(RollbackAuthorityTest, AnotherShardsFailureWarrantMovesOneGeneration) {
  RollbackGrounds restarted;
  restarted.generation = 1;
  restarted.needs_rollback = true;
  RollbackGrounds here;
  here.generation = 3;
  proto::RollbackRequest req = Request(4);
  req.set_warrant(FailureWarrant(kKey, kJob, restarted, 4));
  ASSERT_FALSE(req.warrant().empty());
  EXPECT_EQ(Check(1, here, req), absl::StatusCode::kOk);
  // Once the shard is there, the same warrant moves it no further.
  here.generation = 4;
  req.set_generation(5);
  EXPECT_EQ(Check(1, here, req), absl::StatusCode::kPermissionDenied);
  // Another job's key, or a shard with no reason, makes none that holds.
  RollbackGrounds calm;
  calm.generation = 4;
  EXPECT_EQ(FailureWarrant(kKey, kJob, calm, 5), "");
  req.set_warrant(FailureWarrant("another-key-0123456789abc", kJob, restarted, 5));
  EXPECT_EQ(Check(1, here, req), absl::StatusCode::kPermissionDenied);
  req.set_warrant(FailureWarrant(kKey, "other", restarted, 5));
  EXPECT_EQ(Check(1, here, req), absl::StatusCode::kPermissionDenied);
  // A failure warrant is no decided one: no membership with it, no jump.
  req.set_warrant(FailureWarrant(kKey, kJob, restarted, 6));
  req.set_generation(6);
  EXPECT_EQ(Check(1, here, req), absl::StatusCode::kPermissionDenied);
}

TEST(RollbackAuthorityTest, ShardZerosDecidedWarrantCoversItsMembership) {
  RollbackGrounds behind;
  behind.generation = 2;
  proto::RollbackRequest req = Request(6);
  proto::MembershipSegment* s = req.add_membership();
  s->set_from_step(0);
  s->set_num_workers(2);
  req.set_warrant(DecidedWarrant(kKey, kJob, 6, req.membership()));
  EXPECT_EQ(Check(1, behind, req), absl::StatusCode::kOk);
  s->set_num_workers(3);  // not the membership shard 0 sealed
  EXPECT_EQ(Check(1, behind, req), absl::StatusCode::kPermissionDenied);
  s->set_num_workers(2);
  req.set_generation(7);  // not the generation
  EXPECT_EQ(Check(1, behind, req), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(DecidedWarrant("", kJob, 6, req.membership()), "");
}

}  // namespace
}  // namespace bnps::server
