#include "policy/policy.h"

#include <string>
#include <utility>
#include <vector>

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
  EXPECT_TRUE(BulkSynchronous(Gradients::kSync));
  EXPECT_FALSE(BulkSynchronous(Gradients::kAsync));
  EXPECT_EQ(ShorthandGradients(Policy::kSync), Gradients::kSync);
  EXPECT_EQ(ShorthandGradients(Policy::kAsync), Gradients::kAsync);
  EXPECT_EQ(ShorthandGradients(Policy::kRecal), Gradients::kSync);
  EXPECT_EQ(ShorthandGradients(Policy::kLocal), Gradients::kSync);
  EXPECT_TRUE(BnTrafficWhileTraining(Policy::kSync));
  EXPECT_TRUE(BnTrafficWhileTraining(Policy::kAsync));
  EXPECT_FALSE(BnTrafficWhileTraining(Policy::kRecal));
  EXPECT_FALSE(BnTrafficWhileTraining(Policy::kLocal));
  EXPECT_TRUE(GlobalBnBackward(Policy::kSync));
  EXPECT_FALSE(GlobalBnBackward(Policy::kAsync));
}

TEST(PolicyTest, ResolveShorthandsAndPairs) {
  struct Case {
    const char *policy, *bn, *gradients;
    JobPolicy want;
  } cases[] = {
      {"", "", "", {Policy::kSync, Gradients::kSync}},
      {"async", "", "", {Policy::kAsync, Gradients::kAsync}},
      {"recal", "", "", {Policy::kRecal, Gradients::kSync}},
      {"async", "async", "async", {Policy::kAsync, Gradients::kAsync}},
      {"", "async", "", {Policy::kAsync, Gradients::kSync}},
      {"", "sync", "async", {Policy::kSync, Gradients::kAsync}},
      {"", "recal", "async", {Policy::kRecal, Gradients::kAsync}},
      {"local", "", "sync", {Policy::kLocal, Gradients::kSync}},
  };
  for (const Case& c : cases) {
    absl::StatusOr<JobPolicy> p = ResolvePolicy(c.policy, c.bn, c.gradients);
    ASSERT_TRUE(p.ok()) << c.policy << "/" << c.bn << "/" << c.gradients;
    EXPECT_TRUE(*p == c.want) << c.policy << "/" << c.bn << "/" << c.gradients;
  }
}

TEST(PolicyTest, ResolveRejectsContradictions) {
  absl::StatusOr<JobPolicy> p = ResolvePolicy("async", "", "sync");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("--policy=async means --gradients=async"),
            std::string::npos);
  p = ResolvePolicy("sync", "recal", "");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("--bn_policy=sync"), std::string::npos);
  EXPECT_EQ(ResolvePolicy("", "", "bulk").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolvePolicy("", "global", "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PolicyTest, ListsHoldEveryNameOnce) {
  std::vector<std::string> names;
  for (Policy p : kPolicies) names.push_back(PolicyName(p));
  EXPECT_EQ(names, (std::vector<std::string>{"sync", "async", "recal", "local"}));
  names.clear();
  for (Gradients g : kGradientModes) names.push_back(GradientsName(g));
  EXPECT_EQ(names, (std::vector<std::string>{"sync", "async"}));
}

TEST(PolicyTest, FlagsNameShorthandsWithOneFlagAndOtherPairsWithTwo) {
  EXPECT_EQ(JobPolicyFlags({Policy::kAsync, Gradients::kAsync}),
            (std::vector<std::string>{"--policy=async"}));
  EXPECT_EQ(JobPolicyFlags({Policy::kLocal, Gradients::kSync}),
            (std::vector<std::string>{"--policy=local"}));
  EXPECT_EQ(JobPolicyFlags({Policy::kAsync, Gradients::kSync}),
            (std::vector<std::string>{"--bn_policy=async", "--gradients=sync"}));
  EXPECT_EQ(JobPolicyFlags({Policy::kSync, Gradients::kAsync}),
            (std::vector<std::string>{"--bn_policy=sync", "--gradients=async"}));
}

TEST(PolicyTest, NamesAndConfigRoundTrip) {
  EXPECT_EQ(JobPolicyName({Policy::kAsync, Gradients::kAsync}), "async");
  EXPECT_EQ(JobPolicyName({Policy::kRecal, Gradients::kSync}), "recal");
  EXPECT_EQ(JobPolicyName({Policy::kAsync, Gradients::kSync}),
            "bn_policy=async,gradients=sync");
  for (Policy bn : {Policy::kSync, Policy::kAsync, Policy::kRecal,
                    Policy::kLocal}) {
    for (Gradients g : {Gradients::kSync, Gradients::kAsync}) {
      proto::JobConfig c;
      ToConfig({bn, g}, &c);
      // Shorthand pairs leave the field unset: configs (and checkpoints) of
      // those jobs are what they were before it.
      EXPECT_EQ(c.gradients() == proto::GRADIENTS_UNSPECIFIED,
                g == ShorthandGradients(bn));
      absl::StatusOr<JobPolicy> back = FromConfig(c);
      ASSERT_TRUE(back.ok());
      EXPECT_TRUE(*back == (JobPolicy{bn, g}));
    }
  }
  proto::JobConfig old;  // written before the field: the shorthand's
  old.set_policy(proto::POLICY_ASYNC);
  EXPECT_EQ(FromConfig(old)->gradients, Gradients::kAsync);
  old.set_gradients(static_cast<proto::Gradients>(7));
  EXPECT_EQ(FromConfig(old).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PolicyTest, OnlySyncJobsResize) {
  EXPECT_TRUE(CheckResizable({Policy::kSync, Gradients::kSync}).ok());
  for (JobPolicy p : {JobPolicy{Policy::kAsync, Gradients::kAsync},
                      JobPolicy{Policy::kRecal, Gradients::kSync},
                      JobPolicy{Policy::kLocal, Gradients::kSync},
                      JobPolicy{Policy::kSync, Gradients::kAsync}}) {
    const absl::Status s = CheckResizable(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("resizing needs --policy=sync"),
              std::string::npos)
        << s;
  }
}

TEST(PolicyTest, BnGroupsNeedBnTrafficAndADivisor) {
  const JobPolicy sync{Policy::kSync, Gradients::kSync};
  EXPECT_TRUE(CheckBnGroups(sync, 0, {4}).ok());  // no groups
  EXPECT_TRUE(CheckBnGroups(sync, 2, {4}).ok());
  EXPECT_TRUE(CheckBnGroups(sync, 4, {4, 8}).ok());
  EXPECT_TRUE(CheckBnGroups({Policy::kSync, Gradients::kAsync}, 2, {4}).ok());
  EXPECT_TRUE(CheckBnGroups({Policy::kAsync, Gradients::kAsync}, 2, {4}).ok());
  EXPECT_TRUE(CheckBnGroups({Policy::kAsync, Gradients::kSync}, 4, {8}).ok());
  EXPECT_EQ(CheckBnGroups({Policy::kAsync, Gradients::kAsync}, 3, {4}).code(),
            absl::StatusCode::kInvalidArgument);
  for (const auto& [k, counts] :
       std::vector<std::pair<int, std::vector<int>>>{
           {3, {4}}, {8, {4}}, {2, {4, 6, 3}}, {-1, {4}}}) {
    const absl::Status s = CheckBnGroups(sync, k, counts);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k;
    EXPECT_NE(s.message().find("--bn_group_size"), std::string::npos) << s;
  }
  for (Policy p : {Policy::kRecal, Policy::kLocal}) {
    const absl::Status s = CheckBnGroups({p, ShorthandGradients(p)}, 2, {4});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << PolicyName(p);
    EXPECT_NE(s.message().find("--bn_group_size"), std::string::npos) << s;
    EXPECT_NE(s.message().find(PolicyName(p)), std::string::npos) << s;
  }
}

TEST(PolicyTest, BnGroupsByHost) {
  EXPECT_EQ(ParseBnGroupByHost("").value(), false);
  EXPECT_EQ(ParseBnGroupByHost("host").value(), true);
  const absl::StatusOr<bool> bad = ParseBnGroupByHost("node");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--bn_group"), std::string::npos);
  EXPECT_TRUE(CheckBnGroupByHost({Policy::kSync, Gradients::kSync}, 0, {4}).ok());
  EXPECT_TRUE(CheckBnGroupByHost({Policy::kAsync, Gradients::kAsync}, 0, {4}).ok());
  for (const absl::Status& s :
       {CheckBnGroupByHost({Policy::kLocal, Gradients::kSync}, 0, {4}),
        CheckBnGroupByHost({Policy::kRecal, Gradients::kSync}, 0, {4}),
        CheckBnGroupByHost({Policy::kSync, Gradients::kSync}, 2, {4}),
        CheckBnGroupByHost({Policy::kSync, Gradients::kSync}, 0, {4, 2})}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("--bn_group=host"), std::string::npos) << s;
  }
  EXPECT_EQ(BnGroupsOfHosts({"b", "a", "b", "c", "a"}),
            (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(BnGroupsOfHosts({"x", "x"}), (std::vector<int>{0, 0}));
}

TEST(PolicyTest, BnGroupsAreBlocksOfConsecutiveIds) {
  EXPECT_TRUE(BnGroupOfWorkers(0, 4).empty());
  EXPECT_EQ(BnGroupOfWorkers(2, 6), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(BnGroupOfWorkers(3, 6), (std::vector<int>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(BnGroupOfWorkers(1, 3), (std::vector<int>{0, 1, 2}));
}

TEST(PolicyTest, AnExactBnStalenessNeedsAsyncBn) {
  EXPECT_TRUE(CheckBnStaleness({Policy::kSync, Gradients::kSync}, -1).ok());
  EXPECT_TRUE(CheckBnStaleness({Policy::kAsync, Gradients::kAsync}, 0).ok());
  EXPECT_TRUE(CheckBnStaleness({Policy::kAsync, Gradients::kSync}, 4).ok());
  for (const auto& [p, s] : std::vector<std::pair<Policy, int64_t>>{
           {Policy::kSync, 1}, {Policy::kLocal, 0}, {Policy::kRecal, 2},
           {Policy::kAsync, -2}}) {
    const absl::Status st = CheckBnStaleness({p, ShorthandGradients(p)}, s);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(st.message().find("--bn_staleness"), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace bnps::policy
