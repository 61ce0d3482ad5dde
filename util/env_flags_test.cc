#include "util/env_flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, env_test_count, 1, "A flag for the tests.");
ABSL_FLAG(std::string, env_test_name, "none", "A flag for the tests.");

namespace bnps::util {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

const std::vector<std::string> kFlags = {"num_workers", "servers", "shard",
                                         "worker"};

EnvFlagsOptions WorkerOptions() {
  EnvFlagsOptions o;
  o.job_index_flag = "worker";
  return o;
}

EnvFlagsOptions ServerOptions() {
  EnvFlagsOptions o;
  o.ordinal_flag = "shard";
  return o;
}

// "flag=value" for each assignment, in the plan's order.
std::vector<std::string> Assigned(const EnvPlan& plan) {
  std::vector<std::string> out;
  for (const EnvAssignment& a : plan.assignments) {
    out.push_back(a.flag + "=" + a.value);
  }
  return out;
}

TEST(VariableFor, IsThePrefixAndTheFlagInUpperCase) {
  EXPECT_EQ(VariableFor("num_workers"), "BNPS_NUM_WORKERS");
  EXPECT_EQ(VariableFor("servers"), "BNPS_SERVERS");
}

TEST(PlanFromEnvironment, SetsTheFlagsItsVariablesName) {
  absl::StatusOr<EnvPlan> plan = PlanFromEnvironment(
      {"PATH=/bin", "BNPS_SERVERS=bnps-server-0.bnps:7000,bnps-server-1.bnps:7000",
       "BNPS_NUM_WORKERS=4", "HOME=/root"},
      kFlags, "host", {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Assigned(*plan),
              ::testing::ElementsAre(
                  "num_workers=4",
                  "servers=bnps-server-0.bnps:7000,bnps-server-1.bnps:7000"));
  EXPECT_EQ(plan->assignments[0].source, "BNPS_NUM_WORKERS=4");
  EXPECT_THAT(plan->warnings, IsEmpty());
}

TEST(PlanFromEnvironment, AnEmptyValueIsAValue) {
  absl::StatusOr<EnvPlan> plan =
      PlanFromEnvironment({"BNPS_SERVERS="}, kFlags, "host", {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Assigned(*plan), ::testing::ElementsAre("servers="));
}

TEST(PlanFromEnvironment, AnUnknownVariableIsAnErrorWhenAsked) {
  EnvFlagsOptions o;
  o.unknown_is_error = true;
  absl::StatusOr<EnvPlan> plan = PlanFromEnvironment(
      {"BNPS_NUM_WORKERS=4", "BNPS_NUM_WORKRES=4"}, kFlags, "host", o);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("BNPS_NUM_WORKRES"));
}

TEST(PlanFromEnvironment, AnUnknownVariableIsAWarningNamingIt) {
  absl::StatusOr<EnvPlan> plan = PlanFromEnvironment(
      {"BNPS_PORT=7000", "BNPS_SERVERS=a:1"}, kFlags, "host", {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Assigned(*plan), ::testing::ElementsAre("servers=a:1"));
  ASSERT_EQ(plan->warnings.size(), 1u);
  EXPECT_THAT(plan->warnings[0], HasSubstr("BNPS_PORT"));
}

TEST(PlanFromEnvironment, VariablesAreCaseSensitive) {
  // bnps_servers is not BNPS_SERVERS: neither a flag nor an error.
  absl::StatusOr<EnvPlan> plan =
      PlanFromEnvironment({"bnps_servers=a:1", "Bnps_X=1"}, kFlags, "h", {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->assignments, IsEmpty());
}

TEST(PlanFromEnvironment, JobCompletionIndexSetsTheWorker) {
  absl::StatusOr<EnvPlan> plan = PlanFromEnvironment(
      {"BNPS_NUM_WORKERS=4", "JOB_COMPLETION_INDEX=3"}, kFlags, "pod-x",
      WorkerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Assigned(*plan),
              ::testing::ElementsAre("worker=3", "num_workers=4"));
  EXPECT_EQ(plan->assignments[0].source, "JOB_COMPLETION_INDEX=3");
}

TEST(PlanFromEnvironment, TheWorkersVariableBeatsJobCompletionIndex) {
  absl::StatusOr<EnvPlan> plan = PlanFromEnvironment(
      {"JOB_COMPLETION_INDEX=3", "BNPS_WORKER=1"}, kFlags, "pod-x",
      WorkerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Assigned(*plan), ::testing::ElementsAre("worker=1"));
}

TEST(PlanFromEnvironment, JobCompletionIndexIsIgnoredWithoutAnIndexFlag) {
  absl::StatusOr<EnvPlan> plan =
      PlanFromEnvironment({"JOB_COMPLETION_INDEX=3"}, kFlags, "h", {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->assignments, IsEmpty());
}

TEST(PlanFromEnvironment, ABadJobCompletionIndexIsAnError) {
  for (const char* bad : {"JOB_COMPLETION_INDEX=", "JOB_COMPLETION_INDEX=-1",
                          "JOB_COMPLETION_INDEX=two",
                          "JOB_COMPLETION_INDEX=99999999999"}) {
    absl::StatusOr<EnvPlan> plan =
        PlanFromEnvironment({bad}, kFlags, "h", WorkerOptions());
    ASSERT_FALSE(plan.ok()) << bad;
    EXPECT_THAT(plan.status().message(), HasSubstr("JOB_COMPLETION_INDEX"));
  }
}

TEST(PlanFromEnvironment, FromHostnameTakesTheStatefulSetOrdinal) {
  for (const auto& [host, shard] :
       std::vector<std::pair<std::string, std::string>>{
           {"bnps-server-0", "0"},
           {"bnps-server-1", "1"},
           {"job-a-server-12", "12"},
           {"x-007", "7"}}) {
    absl::StatusOr<EnvPlan> plan = PlanFromEnvironment(
        {"BNPS_SHARD=from-hostname"}, kFlags, host, ServerOptions());
    ASSERT_TRUE(plan.ok()) << host << ": " << plan.status();
    EXPECT_THAT(Assigned(*plan), ::testing::ElementsAre("shard=" + shard))
        << host;
    EXPECT_EQ(plan->assignments[0].source, "BNPS_SHARD=from-hostname");
  }
}

TEST(PlanFromEnvironment, FromHostnameNeedsAnOrdinal) {
  for (const char* host : {"bnps-server", "server1", "bnps-server-",
                           "bnps-server-1a", "", "a-99999999999"}) {
    absl::StatusOr<EnvPlan> plan = PlanFromEnvironment(
        {"BNPS_SHARD=from-hostname"}, kFlags, host, ServerOptions());
    ASSERT_FALSE(plan.ok()) << host;
    EXPECT_THAT(plan.status().message(), HasSubstr("BNPS_SHARD"));
  }
}

TEST(PlanFromEnvironment, TheHostnameIsOnlyReadWhenAsked) {
  // A host called node-3 gives no shard unless the variable says so.
  absl::StatusOr<EnvPlan> plan =
      PlanFromEnvironment({"BNPS_SHARD=2"}, kFlags, "node-3", ServerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Assigned(*plan), ::testing::ElementsAre("shard=2"));
  plan = PlanFromEnvironment({}, kFlags, "node-3", ServerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->assignments, IsEmpty());
}

TEST(PlanFromEnvironment, FromHostnameIsAnOrdinaryValueForOtherFlags) {
  // Passed on as it is; the flag's own parsing then refuses or takes it.
  absl::StatusOr<EnvPlan> plan = PlanFromEnvironment(
      {"BNPS_SERVERS=from-hostname"}, kFlags, "h-1", ServerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Assigned(*plan), ::testing::ElementsAre("servers=from-hostname"));
}

TEST(BinaryFlagNames, ListsTheBinarysFlagsNotAbseils) {
  std::vector<std::string> names = BinaryFlagNames();
  EXPECT_THAT(names, ::testing::Contains("env_test_count"));
  EXPECT_THAT(names, ::testing::Contains("env_test_name"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("flagfile")));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("help")));
}

TEST(EnvironmentHelp, NamesTheVariableOfEveryFlag) {
  std::string help = EnvironmentHelp(kFlags, WorkerOptions());
  EXPECT_THAT(help, HasSubstr("BNPS_NUM_WORKERS"));
  EXPECT_THAT(help, HasSubstr("sets --num_workers"));
  EXPECT_THAT(help, HasSubstr("BNPS_SERVERS"));
  EXPECT_THAT(help, HasSubstr("JOB_COMPLETION_INDEX"));
  EXPECT_THAT(help, ::testing::Not(HasSubstr("from-hostname")));
  EXPECT_THAT(EnvironmentHelp(kFlags, ServerOptions()),
              HasSubstr("BNPS_SHARD=from-hostname"));
}

// ApplyEnvironment reads the real environment; these tests set variables
// only this binary's test flags read, and unset them after.
class ApplyEnvironmentTest : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("BNPS_ENV_TEST_COUNT");
    unsetenv("BNPS_ENV_TEST_NAME");
    unsetenv("BNPS_ENV_TEST_TYPO");
    absl::SetFlag(&FLAGS_env_test_count, 1);
    absl::SetFlag(&FLAGS_env_test_name, "none");
  }
};

TEST_F(ApplyEnvironmentTest, SetsTheFlags) {
  setenv("BNPS_ENV_TEST_COUNT", "5", 1);
  setenv("BNPS_ENV_TEST_NAME", "bnps-server-0.bnps-server", 1);
  absl::Status s = ApplyEnvironment({});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_count), 5);
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_name), "bnps-server-0.bnps-server");
}

TEST_F(ApplyEnvironmentTest, AValueTheFlagCannotTakeNamesTheVariable) {
  setenv("BNPS_ENV_TEST_COUNT", "five", 1);
  absl::Status s = ApplyEnvironment({});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("BNPS_ENV_TEST_COUNT=five"));
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_count), 1);
}

TEST_F(ApplyEnvironmentTest, AnUnknownVariableAsAnErrorSetsNothing) {
  setenv("BNPS_ENV_TEST_COUNT", "5", 1);
  setenv("BNPS_ENV_TEST_TYPO", "1", 1);
  EnvFlagsOptions o;
  o.unknown_is_error = true;
  absl::Status s = ApplyEnvironment(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("BNPS_ENV_TEST_TYPO"));
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_count), 1);
}

TEST_F(ApplyEnvironmentTest, AnUnknownVariableWarnsAndTheRestApplies) {
  setenv("BNPS_ENV_TEST_COUNT", "5", 1);
  setenv("BNPS_ENV_TEST_TYPO", "1", 1);
  testing::internal::CaptureStderr();
  absl::Status s = ApplyEnvironment({});
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(err, HasSubstr("warning: BNPS_ENV_TEST_TYPO"));
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_count), 5);
}

}  // namespace
}  // namespace bnps::util
