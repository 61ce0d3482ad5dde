#include "security/worker_token.h"

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "security/job_token.h"

namespace bnps::security {
namespace {

constexpr char kJob[] = "job-token-0123456789abcdef";

TEST(WorkerTokenTest, DerivedTokensAreValidDistinctAndStable) {
  std::set<std::string> seen;
  for (int w = 0; w < 50; ++w) {
    const std::string t = WorkerToken(kJob, w);
    EXPECT_EQ(t.size(), 64u);
    EXPECT_TRUE(ValidateToken(t).ok()) << t;
    EXPECT_EQ(t, WorkerToken(kJob, w));
    seen.insert(t);
  }
  EXPECT_EQ(seen.size(), 50u);
  EXPECT_NE(WorkerToken(kJob, 0), WorkerToken("another-job-token-0123456", 0));
  // HMAC-SHA256(key, "worker:0"), checked with
  //   printf worker:0 | openssl dgst -sha256 -hmac job-token-0123456789abcdef
  EXPECT_EQ(WorkerToken(kJob, 0),
            "8cb4b28cac77581cede48e71487367febb1d859db9b832a51891b8cea3974a5c");
}

// A seal is HMAC-SHA256(job token, "seal:" + message), checked in full and
// apart from every worker's token.
TEST(WorkerTokenTest, SealsAreTheJobTokensAndMatchOnlyTheirMessage) {
  // Checked with
  //   printf 'seal:loss 1' | openssl dgst -sha256 -hmac job-token-0123456789abcdef
  EXPECT_EQ(Seal(kJob, "loss 1"),
            "d3a44411939c9f1f4e41eaac546fa4f1865a8831bfb35a835a2caa94e7a30952");
  const std::string seal = Seal(kJob, "loss 1");
  EXPECT_TRUE(SealMatches(kJob, "loss 1", seal));
  EXPECT_FALSE(SealMatches(kJob, "loss 2", seal));
  EXPECT_FALSE(SealMatches("another-job-token-0123456", "loss 1", seal));
  EXPECT_FALSE(SealMatches(kJob, "loss 1", seal.substr(0, 63)));
  EXPECT_FALSE(SealMatches(kJob, "loss 1", ""));
  EXPECT_NE(Seal(kJob, "0"), WorkerToken(kJob, 0));
}

TEST(WorkerTokenTest, EachTokenProvesItsOwnWorker) {
  TokenAuthenticator auth(kJob, /*per_worker=*/true, 4);
  EXPECT_EQ(*auth.Authenticate(std::string(kJob)),
            TokenAuthenticator::kAnyWorker);
  for (int w = 0; w < 4; ++w) {
    absl::StatusOr<int> who = auth.Authenticate(WorkerToken(kJob, w));
    ASSERT_TRUE(who.ok()) << who.status();
    EXPECT_EQ(*who, w);
  }
  // Outside the job, another job's, none, or a near miss: refused.
  for (const absl::StatusOr<int>& r :
       {auth.Authenticate(WorkerToken(kJob, 4)),
        auth.Authenticate(WorkerToken("another-job-token-0123456", 1)),
        auth.Authenticate(std::nullopt),
        auth.Authenticate(WorkerToken(kJob, 1).substr(1) + "0")}) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  }
}

TEST(WorkerTokenTest, WithoutPerWorkerTokensOnlyTheJobTokenIsAccepted) {
  TokenAuthenticator auth(kJob, /*per_worker=*/false, 4);
  EXPECT_FALSE(auth.per_worker());
  EXPECT_EQ(*auth.Authenticate(std::string(kJob)),
            TokenAuthenticator::kAnyWorker);
  EXPECT_EQ(auth.Authenticate(WorkerToken(kJob, 0)).status().code(),
            absl::StatusCode::kUnauthenticated);
  TokenAuthenticator open("", /*per_worker=*/false, 4);  // no token at all
  EXPECT_EQ(*open.Authenticate(std::nullopt), TokenAuthenticator::kAnyWorker);
}

}  // namespace
}  // namespace bnps::security
