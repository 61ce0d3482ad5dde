#include "security/call_session.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace bnps::security {
namespace {

constexpr char kJob[] = "job-token-0123456789abcdef";
constexpr char kMethod[] = "/bnps.proto.ParameterServer/Heartbeat";

// Opens and confirms a session of `worker` holding `token` on `table`: the
// client's session, or why the handshake failed. `sent` (if set) gets every
// byte the client sent.
absl::StatusOr<std::unique_ptr<ClientSession>> OpenSession(
    SessionTable& table, const std::string& token, int worker,
    std::string* sent = nullptr) {
  SessionOpener opener("j", worker, token, "shard 0");
  const proto::SessionRequest open = opener.Open();
  if (sent != nullptr) *sent += open.SerializeAsString();
  absl::StatusOr<proto::SessionResponse> challenge = table.Handle(open);
  if (!challenge.ok()) return challenge.status();
  absl::StatusOr<proto::SessionRequest> confirm = opener.OnChallenge(*challenge);
  if (!confirm.ok()) return confirm.status();
  if (sent != nullptr) *sent += confirm->SerializeAsString();
  absl::StatusOr<proto::SessionResponse> done = table.Handle(*confirm);
  if (!done.ok()) return done.status();
  return opener.Confirmed();
}

TEST(CallSessionTest, TheJobTokenAndAWorkersOwnOpenSessionsOfTheirAuthority) {
  TokenAuthenticator auth(kJob, /*per_worker=*/true, 4);
  SessionTable table(&auth, {.num_workers = 4});
  absl::StatusOr<std::unique_ptr<ClientSession>> job = OpenSession(table, kJob, -1);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<int> caller = table.Verify((*job)->Sign(kMethod, "0"), kMethod, "0");
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(*caller, TokenAuthenticator::kAnyWorker);

  absl::StatusOr<std::unique_ptr<ClientSession>> own =
      OpenSession(table, WorkerToken(kJob, 2), 2);
  ASSERT_TRUE(own.ok()) << own.status();
  caller = table.Verify((*own)->Sign(kMethod, "3"), kMethod, "3");
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(*caller, 2);
}

TEST(CallSessionTest, AWorkersTokenCannotOpenASessionAsAnotherWorker) {
  TokenAuthenticator auth(kJob, /*per_worker=*/true, 4);
  SessionTable table(&auth, {.num_workers = 4});
  // Worker 1's token naming worker 2: the server proves itself under worker
  // 2's key, which worker 1 cannot check, so it sends nothing more.
  absl::StatusOr<std::unique_ptr<ClientSession>> other =
      OpenSession(table, WorkerToken(kJob, 1), 2);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kUnauthenticated);
  // A proof made with worker 1's key for worker 2's opening does not hold.
  SessionOpener opener("j", 2, WorkerToken(kJob, 1), "shard 0");
  absl::StatusOr<proto::SessionResponse> challenge = table.Handle(opener.Open());
  ASSERT_TRUE(challenge.ok());
  proto::SessionResponse forged = *challenge;
  forged.mutable_reply()->set_worker_proof(HandshakeProof(
      WorkerToken(kJob, 1), "server",
      HelloTranscript(opener.Open().hello(), kSessionTransport,
                      challenge->reply().server_nonce())));
  // (Open() makes the same hello: the nonce is fixed per opener.)
  absl::StatusOr<proto::SessionRequest> confirm = opener.OnChallenge(forged);
  ASSERT_TRUE(confirm.ok()) << confirm.status();
  EXPECT_EQ(table.Handle(*confirm).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(table.confirmed(), 0u);
}

TEST(CallSessionTest, ARecordedCallIsRefusedWhenPlayedAgain) {
  TokenAuthenticator auth(kJob, /*per_worker=*/false, 2);
  SessionTable table(&auth, {.num_workers = 2});
  absl::StatusOr<std::unique_ptr<ClientSession>> s = OpenSession(table, kJob, 0);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string first = (*s)->Sign(kMethod, "0");
  const std::string second = (*s)->Sign(kMethod, "0");
  // Out of order within the window: both pass once.
  EXPECT_TRUE(table.Verify(second, kMethod, "0").ok());
  EXPECT_TRUE(table.Verify(first, kMethod, "0").ok());
  absl::StatusOr<int> again = table.Verify(first, kMethod, "0");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(again.status().message().find("used before"), std::string::npos);
  EXPECT_FALSE(table.Verify(second, kMethod, "0").ok());
  // Older than the window: refused even if never seen.
  const std::string old = (*s)->Sign(kMethod, "0");
  for (uint64_t i = 0; i < kReplayWindow; ++i) (*s)->Sign(kMethod, "0");
  ASSERT_TRUE(table.Verify((*s)->Sign(kMethod, "0"), kMethod, "0").ok());
  EXPECT_NE(table.Verify(old, kMethod, "0").status().message().find("older"),
            std::string::npos);
}

TEST(CallSessionTest, TheMacBindsTheMethodAndTheGeneration) {
  TokenAuthenticator auth(kJob, /*per_worker=*/false, 2);
  SessionTable table(&auth, {.num_workers = 2});
  absl::StatusOr<std::unique_ptr<ClientSession>> s = OpenSession(table, kJob, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(table
                   .Verify((*s)->Sign(kMethod, "4"),
                           "/bnps.proto.ParameterServer/Rollback", "4")
                   .ok());
  EXPECT_FALSE(table.Verify((*s)->Sign(kMethod, "4"), kMethod, "5").ok());
  // A MAC that failed does not burn its sequence for the real call.
  const std::string real = (*s)->Sign(kMethod, "4");
  EXPECT_FALSE(table.Verify(real, kMethod, "6").ok());
  EXPECT_TRUE(table.Verify(real, kMethod, "4").ok());
}

TEST(CallSessionTest, ManyOpeningsDoNotEvictAConfirmedCallKey) {
  TokenAuthenticator auth(kJob, /*per_worker=*/false, 2);
  SessionTable table(&auth, {.num_workers = 2, .max_pending = 8});
  absl::StatusOr<std::unique_ptr<ClientSession>> s = OpenSession(table, kJob, 0);
  ASSERT_TRUE(s.ok()) << s.status();
  SessionOpener early("j", 1, kJob, "shard 0");
  absl::StatusOr<proto::SessionResponse> early_challenge =
      table.Handle(early.Open());
  ASSERT_TRUE(early_challenge.ok());
  for (int i = 0; i < 1000; ++i) {
    SessionOpener stranger("j", i % 2, "not-the-token-at-all", "shard 0");
    ASSERT_TRUE(table.Handle(stranger.Open()).ok());
  }
  EXPECT_EQ(table.pending(), 8u);
  EXPECT_TRUE(table.Verify((*s)->Sign(kMethod, "0"), kMethod, "0").ok());
  // The opening evicted meanwhile cannot be confirmed any more.
  absl::StatusOr<proto::SessionRequest> confirm =
      early.OnChallenge(*early_challenge);
  ASSERT_TRUE(confirm.ok());
  EXPECT_EQ(table.Handle(*confirm).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(CallSessionTest, ANewSessionOfAWorkerReplacesItsOldest) {
  TokenAuthenticator auth(kJob, /*per_worker=*/false, 2);
  SessionTable table(&auth, {.num_workers = 2, .sessions_per_worker = 2});
  auto a = OpenSession(table, kJob, 0);
  auto b = OpenSession(table, kJob, 0);
  auto other = OpenSession(table, kJob, 1);
  auto c = OpenSession(table, kJob, 0);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && other.ok());
  EXPECT_EQ(table.confirmed(), 3u);
  EXPECT_NE(table.Verify((*a)->Sign(kMethod, "0"), kMethod, "0")
                .status()
                .message()
                .find("unknown"),
            std::string::npos);
  EXPECT_TRUE(table.Verify((*b)->Sign(kMethod, "0"), kMethod, "0").ok());
  EXPECT_TRUE(table.Verify((*c)->Sign(kMethod, "0"), kMethod, "0").ok());
  EXPECT_TRUE(table.Verify((*other)->Sign(kMethod, "0"), kMethod, "0").ok());
}

TEST(CallSessionTest, AServerThatForgotItsSessionsRefusesTheirCalls) {
  TokenAuthenticator auth(kJob, /*per_worker=*/false, 1);
  SessionTable before(&auth, {.num_workers = 1});
  auto s = OpenSession(before, kJob, 0);
  ASSERT_TRUE(s.ok());
  SessionTable restarted(&auth, {.num_workers = 1});
  EXPECT_EQ(restarted.Verify((*s)->Sign(kMethod, "0"), kMethod, "0").status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(CallSessionTest, AnotherJobsServerLearnsNothingAndGetsNoProof) {
  TokenAuthenticator other(std::string("another-job-token-000000"), false, 1);
  SessionTable fake(&other, {.num_workers = 1});
  std::string sent;
  auto s = OpenSession(fake, kJob, 0, &sent);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(fake.confirmed(), 0u);
  EXPECT_EQ(sent.find(kJob), std::string::npos);
  // The client sent the opening only: no proof.
  proto::SessionRequest open;
  ASSERT_TRUE(open.ParseFromString(sent));
  EXPECT_FALSE(open.has_proof());
}

TEST(CallSessionTest, OpeningsOutsideTheJobAreRefused) {
  TokenAuthenticator auth(kJob, /*per_worker=*/false, 2);
  SessionTable table(&auth, {.num_workers = 2});
  SessionOpener far("j", 2, kJob, "shard 0");
  EXPECT_EQ(table.Handle(far.Open()).status().code(),
            absl::StatusCode::kInvalidArgument);
  proto::SessionRequest relay = SessionOpener("j", 0, kJob, "s").Open();
  relay.mutable_hello()->set_upstream("10.0.0.1:1");
  EXPECT_EQ(table.Handle(relay).status().code(),
            absl::StatusCode::kInvalidArgument);
  proto::SessionRequest with_token = SessionOpener("j", 0, kJob, "s").Open();
  with_token.mutable_hello()->set_token(kJob);
  EXPECT_EQ(table.Handle(with_token).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CallSessionTest, CallAuthParsesOnlyItsOwnForm) {
  CallAuth a;
  a.session = 0x0123456789abcdefu;
  a.sequence = 42;
  a.mac = std::string(32, '\x7f');
  const std::string text = FormatCallAuth(a);
  absl::StatusOr<CallAuth> back = ParseCallAuth(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->session, a.session);
  EXPECT_EQ(back->sequence, 42u);
  EXPECT_EQ(back->mac, a.mac);
  for (const std::string& bad :
       {std::string(""), std::string("a.b.c"), text + ".", text.substr(1),
        text + "0", std::string("0123456789abcdef.0.") + std::string(64, '0'),
        std::string("0123456789abcdef.-1.") + std::string(64, '0'),
        std::string("0123456789ABCDEF.1.") + std::string(64, '0'),
        std::string("0123456789abcdef.99999999999999999999.") +
            std::string(64, '0')}) {
    EXPECT_EQ(ParseCallAuth(bad).status().code(),
              absl::StatusCode::kUnauthenticated)
        << bad;
  }
}

}  // namespace
}  // namespace bnps::security
