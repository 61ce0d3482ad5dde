#include "security/bn_handshake.h"

#include <string>

#include "gtest/gtest.h"

namespace bnps::security {
namespace {

constexpr char kJob[] = "job-token-0123456789abcdef";

proto::BnHello Hello(int worker) {
  proto::BnHello h;
  h.set_job("j");
  h.set_worker(worker);
  h.set_generation(3);
  return h;
}

// One whole handshake in memory: what each side sent, and who the server
// says the caller is.
struct Exchange {
  proto::BnHello hello;
  proto::BnHelloReply challenge;
  absl::StatusOr<std::optional<proto::BnHelloProof>> proof;
  absl::StatusOr<int> caller = absl::UnknownError("not reached");
};

Exchange Handshake(const TokenAuthenticator& auth, const std::string& token,
              int worker) {
  Exchange r;
  HelloClient client(Hello(worker), token, "tcp", "shard 0");
  HelloServer server(&auth, "tcp");
  r.hello = client.hello();
  absl::StatusOr<proto::BnHelloReply> first = server.Begin(r.hello);
  EXPECT_TRUE(first.ok()) << first.status();
  r.challenge = *first;
  r.proof = client.OnFirstReply(r.challenge);
  if (r.proof.ok() && r.proof->has_value()) r.caller = server.Finish(**r.proof);
  if (r.proof.ok() && !r.proof->has_value()) r.caller = TokenAuthenticator::kAnyWorker;
  return r;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(BnHandshakeTest, TheJobTokenAndAWorkersOwnProveWhoTheyAre) {
  TokenAuthenticator auth(kJob, /*per_worker=*/true, 4);
  Exchange job = Handshake(auth, kJob, 2);
  ASSERT_TRUE(job.caller.ok()) << job.caller.status();
  EXPECT_EQ(*job.caller, TokenAuthenticator::kAnyWorker);
  Exchange own = Handshake(auth, WorkerToken(kJob, 2), 2);
  ASSERT_TRUE(own.caller.ok()) << own.caller.status();
  EXPECT_EQ(*own.caller, 2);
  // Worker 1's own token cannot say hello as worker 2: the server proves
  // under worker 2's key, which worker 1 cannot check.
  Exchange other = Handshake(auth, WorkerToken(kJob, 1), 2);
  EXPECT_EQ(other.proof.status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(BnHandshakeTest, NoFrameCarriesTheToken) {
  TokenAuthenticator auth(kJob, /*per_worker=*/true, 4);
  const std::string own = WorkerToken(kJob, 2);
  Exchange r = Handshake(auth, own, 2);
  ASSERT_TRUE(r.caller.ok());
  const std::string wire = r.hello.SerializeAsString() +
                           r.challenge.SerializeAsString() +
                           (*r.proof)->SerializeAsString();
  EXPECT_FALSE(Contains(wire, kJob));
  EXPECT_FALSE(Contains(wire, own));
}

TEST(BnHandshakeTest, APlantedListenerCannotProveItselfAndGetsNoProof) {
  // It answers as a server of another key would (or with made-up proofs).
  TokenAuthenticator impostor("some-other-token-0123456789", false, 0);
  Exchange r = Handshake(impostor, kJob, 0);
  EXPECT_EQ(r.proof.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Contains(std::string(r.proof.status().message()),
                       "could not prove it holds this job's key"));
  // One that claims no token is needed is refused by a client holding one.
  TokenAuthenticator open("", false, 0);
  Exchange o = Handshake(open, kJob, 0);
  EXPECT_EQ(o.proof.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Contains(std::string(o.proof.status().message()),
                       "without proving it holds the job's key"));
}

TEST(BnHandshakeTest, ARecordedProofDoesNotOpenAnotherConnection) {
  TokenAuthenticator auth(kJob, false, 0);
  Exchange recorded = Handshake(auth, kJob, 0);
  ASSERT_TRUE(recorded.caller.ok());
  // The attacker replays the hello and the proof to a new connection: the
  // server's nonce is new, so the proof does not hold.
  HelloServer server(&auth, "tcp");
  ASSERT_TRUE(server.Begin(recorded.hello).ok());
  EXPECT_EQ(server.Finish(**recorded.proof).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Nor over the other transport.
  HelloServer unix_server(&auth, "unix");
  ASSERT_TRUE(unix_server.Begin(recorded.hello).ok());
  EXPECT_FALSE(unix_server.Finish(**recorded.proof).ok());
}

TEST(BnHandshakeTest, WithoutATokenTheFirstReplyIsFinal) {
  TokenAuthenticator open("", false, 0);
  Exchange r = Handshake(open, "", 1);
  EXPECT_FALSE(r.challenge.challenge());
  ASSERT_TRUE(r.proof.ok());
  EXPECT_FALSE(r.proof->has_value());
  // A job with a token and a client without one: told what to give.
  TokenAuthenticator auth(kJob, false, 0);
  Exchange none = Handshake(auth, "", 1);
  EXPECT_EQ(none.proof.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Contains(std::string(none.proof.status().message()), "--token_file"));
}

TEST(BnHandshakeTest, AHelloWithATokenOrWithoutANonceIsRefused) {
  TokenAuthenticator auth(kJob, false, 0);
  HelloServer server(&auth, "tcp");
  proto::BnHello old = Hello(0);
  old.set_client_nonce(NewHelloNonce());
  old.set_token(kJob);
  EXPECT_EQ(server.Begin(old).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server.Begin(Hello(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(server.awaiting_proof());
}

TEST(BnHandshakeTest, TheTranscriptBindsEveryField) {
  proto::BnHello a = Hello(1);
  a.set_client_nonce("n");
  const std::string base = HelloTranscript(a, "tcp", "s");
  EXPECT_NE(HelloTranscript(a, "unix", "s"), base);
  EXPECT_NE(HelloTranscript(a, "tcp", "t"), base);
  proto::BnHello b = a;
  b.set_generation(4);
  EXPECT_NE(HelloTranscript(b, "tcp", "s"), base);
  b = a;
  b.add_workers(1);
  EXPECT_NE(HelloTranscript(b, "tcp", "s"), base);
  b = a;
  b.set_upstream("h:1");
  EXPECT_NE(HelloTranscript(b, "tcp", "s"), base);
  b = a;
  b.set_job("j;worker=1");  // no field can pose as another
  EXPECT_NE(HelloTranscript(b, "tcp", "s"), base);
}

}  // namespace
}  // namespace bnps::security
