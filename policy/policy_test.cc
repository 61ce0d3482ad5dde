#include "policy/policy.h"

#include "gtest/gtest.h"

namespace bnps::policy {
namespace {

TEST(PolicyTest, NamesRoundTripThroughParseAndTheWire) {
  for (Policy p : {Policy::kSync, Policy::kAsync, Policy::kRecal,
                   Policy::kLocal}) {
    absl::StatusOr<Policy> parsed = ParsePolicy(PolicyName(p));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, p);
    absl::StatusOr<Policy> wire = FromProto(ToProto(p));
    ASSERT_TRUE(wire.ok()) << wire.status();
    EXPECT_EQ(*wire, p);
  }
  for (WorkerLoss w : {WorkerLoss::kFail, WorkerLoss::kShrink, WorkerLoss::kWait}) {
    absl::StatusOr<WorkerLoss> parsed = ParseWorkerLoss(WorkerLossName(w));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, w);
  }
  EXPECT_EQ(ToProto(WorkerLoss::kFail), proto::WORKER_LOSS_FAIL);
  EXPECT_EQ(ToProto(WorkerLoss::kShrink), proto::WORKER_LOSS_SHRINK);
  EXPECT_EQ(ToProto(WorkerLoss::kWait), proto::WORKER_LOSS_WAIT);
}

TEST(PolicyTest, UnknownNamesAndWireValuesAreRefused) {
  absl::StatusOr<Policy> p = ParsePolicy("SyncBN");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("sync, async, recal or local"),
            std::string::npos);
  EXPECT_EQ(ParseWorkerLoss("linger").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromProto(proto::POLICY_UNSPECIFIED).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromProto(static_cast<proto::Policy>(99)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PolicyTest, Properties) {
  EXPECT_TRUE(BulkSynchronous(Policy::kSync));
  EXPECT_FALSE(BulkSynchronous(Policy::kAsync));
  EXPECT_TRUE(BulkSynchronous(Policy::kRecal));
  EXPECT_TRUE(BulkSynchronous(Policy::kLocal));
  EXPECT_TRUE(BnTrafficWhileTraining(Policy::kSync));
  EXPECT_TRUE(BnTrafficWhileTraining(Policy::kAsync));
  EXPECT_FALSE(BnTrafficWhileTraining(Policy::kRecal));
  EXPECT_FALSE(BnTrafficWhileTraining(Policy::kLocal));
  EXPECT_TRUE(GlobalBnBackward(Policy::kSync));
  EXPECT_FALSE(GlobalBnBackward(Policy::kAsync));
}

}  // namespace
}  // namespace bnps::policy
