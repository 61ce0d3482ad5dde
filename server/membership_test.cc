#include "server/membership.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace bnps::server {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
constexpr absl::Duration kTimeout = absl::Seconds(3);

TEST(MembershipTest, OneProcessPerWorker) {
  Membership m(2, kTimeout);
  ASSERT_TRUE(m.Register(0, 5, kT0).ok());
  EXPECT_TRUE(m.Register(0, 5, kT0).ok());  // a retried call
  const absl::Status twice = m.Register(0, 6, kT0 + absl::Seconds(1));
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("worker 0 is already registered by another "
                                 "live process (last heard from 1s ago)"),
            std::string::npos)
      << twice;
  EXPECT_EQ(m.Snapshot()[0].incarnation, 5u);
  EXPECT_TRUE(m.Heartbeat(0, 5, kT0).ok());
  EXPECT_EQ(m.Heartbeat(0, 6, kT0).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.Heartbeat(1, 5, kT0).code(),
            absl::StatusCode::kFailedPrecondition);  // not registered
}

TEST(MembershipTest, BadIdsAndIncarnations) {
  Membership m(2, kTimeout);
  EXPECT_EQ(m.Register(2, 5, kT0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Register(-1, 5, kT0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Register(0, 0, kT0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Heartbeat(0, 0, kT0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(m.IsLost(7));
}

TEST(MembershipTest, LostIsFinalButForRejoin) {
  Membership m(2, kTimeout);
  ASSERT_TRUE(m.Register(0, 5, kT0).ok());
  ASSERT_TRUE(m.Register(1, 5, kT0).ok());
  EXPECT_TRUE(m.CheckTimeouts(kT0 + kTimeout).empty());  // not yet
  ASSERT_TRUE(m.Heartbeat(0, 5, kT0 + absl::Seconds(2)).ok());
  EXPECT_EQ(m.CheckTimeouts(kT0 + absl::Seconds(4)), (std::vector<int>{1}));
  EXPECT_TRUE(m.CheckTimeouts(kT0 + absl::Seconds(4)).empty());  // once
  EXPECT_TRUE(m.IsLost(1));
  EXPECT_EQ(m.LiveWorkers(), (std::vector<int>{0}));
  for (uint64_t incarnation : {5, 6}) {
    const absl::Status s = m.Register(1, incarnation, kT0 + absl::Seconds(4));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("worker 1 was lost (no heartbeat for 3s)"),
              std::string::npos)
        << s;
  }
  EXPECT_EQ(m.Rejoin(0, 6, kT0).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m.Rejoin(1, 6, kT0 + absl::Seconds(5)).ok());
  EXPECT_FALSE(m.IsLost(1));
  EXPECT_EQ(m.LiveWorkers(), (std::vector<int>{0, 1}));
  EXPECT_TRUE(m.Heartbeat(1, 6, kT0 + absl::Seconds(6)).ok());
  EXPECT_EQ(m.Heartbeat(1, 5, kT0 + absl::Seconds(6)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(MembershipTest, AFinishedWorkerIsNeverLostAndCannotJoinAgain) {
  Membership m(2, kTimeout);
  ASSERT_TRUE(m.Register(0, 5, kT0).ok());
  EXPECT_EQ(m.Finish(0, 6).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.Finish(1, 5).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.Finish(2, 5).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(m.Finish(0, 5).ok());
  EXPECT_TRUE(m.Finish(0, 5).ok());  // a retried call
  EXPECT_TRUE(m.Snapshot()[0].finished);
  EXPECT_TRUE(m.LiveWorkers().empty());
  EXPECT_TRUE(m.CheckTimeouts(kT0 + 10 * kTimeout).empty());
  EXPECT_FALSE(m.IsLost(0));
  EXPECT_TRUE(m.Heartbeat(0, 5, kT0).ok());  // a late one of its process
  for (uint64_t incarnation : {5, 6}) {
    const absl::Status s = m.Register(0, incarnation, kT0);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("worker 0 finished the job already"),
              std::string::npos)
        << s;
  }
}

// A lost worker is named with the host its calls came from, once known
// (on another host, the address says which machine to look at).
TEST(MembershipTest, LostTextNamesWhereTheWorkerWasLastHeardFrom) {
  Membership m(2, kTimeout);
  ASSERT_TRUE(m.Register(0, 5, kT0).ok());
  ASSERT_TRUE(m.Register(1, 5, kT0).ok());
  m.SetAddress(1, "10.77.0.4");
  m.SetAddress(7, "10.77.0.9");  // outside the job: ignored
  EXPECT_EQ(m.CheckTimeouts(kT0 + absl::Seconds(4)), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.LostText(0), "worker 0 was lost (no heartbeat for 3s)");
  EXPECT_EQ(m.LostText(1),
            "worker 1 was lost (no heartbeat for 3s; last heard from "
            "10.77.0.4)");
  EXPECT_EQ(m.Heartbeat(1, 5, kT0 + absl::Seconds(4)).message(),
            "worker 1 was lost (no heartbeat for 3s; last heard from "
            "10.77.0.4): the job dropped it");
}

// A server restarted from a checkpoint knows the registrations of then: a
// worker restarted after the checkpoint heartbeats with another incarnation
// before it registers again (in its rollback), which must not stop it.
TEST(MembershipTest, HeartbeatsAgainstRestoredRegistrationsAreNotFinal) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  Membership m(2, absl::Seconds(10));
  std::vector<Membership::WorkerInfo> infos(2);
  infos[0].registered = true;
  infos[0].incarnation = 5;  // the process before the restart
  m.Restore(infos, t0);
  absl::Status s = m.Heartbeat(0, 7, t0);
  EXPECT_FALSE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  s = m.Heartbeat(1, 8, t0);  // restored as not registered
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_TRUE(m.Heartbeat(0, 5, t0).ok());  // the checkpoint's process
  // Once the new process registered (Replace under wait), the old one's
  // heartbeats are final again.
  ASSERT_TRUE(m.Replace(0, 7, t0).ok());
  EXPECT_TRUE(m.Heartbeat(0, 7, t0).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(m.Heartbeat(0, 5, t0)));
}

}  // namespace
// Another shard's word makes a live worker lost at once (reported by the
// next CheckTimeouts, once), named as that shard found it; only for the
// process it names, and only while that process is live here.
TEST(MembershipTest, AnotherShardsLossMarksTheSameProcessLost) {
  Membership m(3, kTimeout);
  ASSERT_TRUE(m.Register(0, 5, kT0).ok());
  ASSERT_TRUE(m.Register(1, 5, kT0).ok());
  const std::string said = "worker 1 was lost (no heartbeat for 3s)";
  EXPECT_FALSE(m.MarkLost(1, 6, 0, said));  // another process
  EXPECT_FALSE(m.MarkLost(2, 5, 0, said));  // never registered here
  EXPECT_FALSE(m.MarkLost(9, 5, 0, said));  // outside the job
  ASSERT_TRUE(m.MarkLost(1, 5, 0, said));
  EXPECT_FALSE(m.MarkLost(1, 5, 2, said));  // lost already
  EXPECT_TRUE(m.IsLost(1));
  EXPECT_EQ(m.CheckTimeouts(kT0 + absl::Seconds(1)), (std::vector<int>{1}));
  EXPECT_TRUE(m.CheckTimeouts(kT0 + absl::Seconds(1)).empty());
  EXPECT_EQ(m.LostText(1), "shard 0 found that " + said);
  EXPECT_EQ(m.Heartbeat(1, 5, kT0).code(),
            absl::StatusCode::kFailedPrecondition);
  // The finding keeps its shard and words; worker 0 is lost here, by its
  // own silence, with this membership's words.
  EXPECT_EQ(m.CheckTimeouts(kT0 + absl::Seconds(4)), (std::vector<int>{0}));
  std::vector<Membership::Loss> losses = m.Losses();
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_EQ(losses[0].worker, 0);
  EXPECT_EQ(losses[0].shard, -1);
  EXPECT_EQ(losses[0].reason, m.LostText(0));
  EXPECT_EQ(losses[1].worker, 1);
  EXPECT_EQ(losses[1].incarnation, 5u);
  EXPECT_EQ(losses[1].shard, 0);
  EXPECT_EQ(losses[1].reason, said);
  // Live again (a relaunch that may rejoin): no longer listed, its own
  // words again.
  ASSERT_TRUE(m.Rejoin(1, 7, kT0 + absl::Seconds(4)).ok());
  ASSERT_EQ(m.Losses().size(), 1u);
  EXPECT_EQ(m.CheckTimeouts(kT0 + absl::Seconds(8)), (std::vector<int>{1}));
  EXPECT_EQ(m.LostText(1), "worker 1 was lost (no heartbeat for 3s)");
}

// A finished worker is not lost on anyone's word.
TEST(MembershipTest, NoLossOfAFinishedWorker) {
  Membership m(1, kTimeout);
  ASSERT_TRUE(m.Register(0, 5, kT0).ok());
  ASSERT_TRUE(m.Finish(0, 5).ok());
  EXPECT_FALSE(m.MarkLost(0, 5, 1, "worker 0 was lost"));
  EXPECT_TRUE(m.Losses().empty());
}

}  // namespace bnps::server
