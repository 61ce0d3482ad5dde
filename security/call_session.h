// Sessions for the gRPC calls of a job that has a token but no TLS: the
// token (the job's or a worker's own) never crosses the wire, and no
// recorded call can be played again.
//
// Opening (proto SessionRequest / SessionResponse, the Session rpc) is the
// BN hello's handshake (security/bn_handshake.h) with the transport "grpc":
// the client sends its identity (job, worker; -1 for a tool that names no
// worker) and a fresh nonce; the server answers with a session id, its own
// nonce and its proofs that it holds the key; the client checks one BEFORE
// it sends anything else, then sends its proof; the server confirms. Both
// sides then derive the session key, SessionKey(key, transcript), which
// neither proof reveals. Each call then carries, in its metadata
// kCallAuthMetadataKey, "<session>.<sequence>.<mac>": the session id (16
// hex digits), a sequence number the client counts up from 1, and
// HMAC-SHA256 under the session key over the method, the sequence, the
// session's worker and the call's generation metadata (64 hex digits).
//
// Threat model. An eavesdropper sees nonces, proofs and MACs: none gives a
// key away (HMAC), a proof is bound to one handshake's nonces, and a MAC to
// one call. A listener posing as a server cannot prove itself and gets no
// proof (the client stops). A recorded call played again is refused: the
// server keeps, per session, the highest sequence seen and a window of
// kReplayWindow sequences below it; a sequence seen before, or older than
// the window, is refused. A session acts with the authority of the key that
// opened it (TokenAuthenticator: the job token as any worker, a worker's
// own token as that worker alone), so one worker's session cannot act as
// another. Not covered: the request bodies are not authenticated (an
// active man-in-the-middle may alter a call in flight, or drop it); use TLS
// off a trusted network.
//
// Bounds. Unconfirmed sessions (an opening without its proof yet) live in a
// pool of Options::max_pending, oldest evicted first, so a stranger who
// opens many evicts only other openings, never a confirmed session.
// Confirmed sessions are kept per worker (the hello's, -1 included): at
// most Options::sessions_per_worker each, a new one replacing that worker's
// oldest (a restarted worker replaces its predecessor's; a few let a worker
// and a tool of the same identity work side by side). A server forgets its
// sessions when it restarts: the client opens a new one on UNAUTHENTICATED.
//
// Example (server):
//   SessionTable table(&auth, {.num_workers = 4});
//   absl::StatusOr<proto::SessionResponse> r = table.Handle(request);
//   ...
//   absl::StatusOr<int> caller = table.Verify(metadata_value, method, gen);
// Example (client):
//   SessionOpener opener("job", /*worker=*/2, token, "shard 0 (h:7000)");
//   proto::SessionResponse challenge = <Session rpc>(opener.Open());
//   absl::StatusOr<proto::SessionRequest> confirm = opener.OnChallenge(challenge);
//   <Session rpc>(*confirm);
//   ClientSession session = opener.Confirmed();
//   context.AddMetadata(kCallAuthMetadataKey, session.Sign(method, gen));
//
// Thread-safety: SessionTable and ClientSession are thread-safe; a
// SessionOpener is for one thread; the functions are pure.

#ifndef BNPS_SECURITY_CALL_SESSION_H_
#define BNPS_SECURITY_CALL_SESSION_H_

#include <atomic>
#include <bitset>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/bnps.pb.h"
#include "security/bn_handshake.h"
#include "security/worker_token.h"

namespace bnps::security {

// The metadata key of a call's session, sequence and MAC (lower case, as
// gRPC requires).
inline constexpr absl::string_view kCallAuthMetadataKey = "bnps-call-auth";
// The transport the handshake's transcript names.
inline constexpr absl::string_view kSessionTransport = "grpc";
// Sequences below the highest seen that a session still accepts (once).
inline constexpr uint64_t kReplayWindow = 1024;

// What a call carries under a session.
struct CallAuth {
  uint64_t session = 0;
  uint64_t sequence = 0;
  std::string mac;  // 32 raw bytes
};

// "<16 hex digits>.<decimal>.<64 hex digits>".
std::string FormatCallAuth(const CallAuth& auth);
// The inverse; UNAUTHENTICATED (saying what is wrong, quoting nothing) for
// any other text, a sequence of 0 included.
absl::StatusOr<CallAuth> ParseCallAuth(absl::string_view text);

// The MAC of one call (32 raw bytes): HMAC-SHA256(session key, the method,
// the sequence, the worker and the generation metadata, each
// length-prefixed). `generation`: the call's generation metadata as sent
// (empty if none).
std::string CallMac(absl::string_view session_key, absl::string_view method,
                    uint64_t sequence, int worker, absl::string_view generation);

// The client's side of a confirmed session: signs calls.
class ClientSession {
 public:
  ClientSession(uint64_t id, std::string key, int worker)
      : id_(id), key_(std::move(key)), worker_(worker) {}

  uint64_t id() const { return id_; }
  // The metadata value for the next call of `method` ("/package.Service/
  // Method") with generation metadata `generation`; each call takes the next
  // sequence.
  std::string Sign(absl::string_view method, absl::string_view generation);

 private:
  const uint64_t id_;
  const std::string key_;
  const int worker_;
  std::atomic<uint64_t> next_{1};
};

// The client's side of one opening.
class SessionOpener {
 public:
  // `worker`: who the session speaks for (-1: no worker, a tool). `token`:
  // the job's or that worker's own; not empty. `where` names the server in
  // errors.
  SessionOpener(std::string job, int worker, std::string token,
                std::string where);

  // The opening request (the hello with a fresh nonce).
  proto::SessionRequest Open() const;
  // The confirming request, once the server's challenge proved it holds
  // the key; UNAUTHENTICATED if it did not (nothing else is to be sent
  // there), or if it sent no challenge (a server without a token).
  absl::StatusOr<proto::SessionRequest> OnChallenge(
      const proto::SessionResponse& response);
  // The session, once the server answered the confirming request OK.
  // REQUIRES: OnChallenge succeeded.
  std::unique_ptr<ClientSession> Confirmed() const;

 private:
  HelloClient hello_;
  const std::string token_;
  uint64_t session_ = 0;
  std::string key_;
};

// The server's sessions.
class SessionTable {
 public:
  struct Options {
    // Workers of the job: a session speaks for one in [-1, num_workers).
    int num_workers = 1;
    // Openings awaiting their proof; the oldest is evicted past this.
    size_t max_pending = 256;
    // Confirmed sessions per worker; a new one evicts that worker's oldest.
    size_t sessions_per_worker = 4;
  };

  // `auth` (not owned) must outlive this. REQUIRES: auth->required().
  SessionTable(const TokenAuthenticator* auth, Options options);

  // Serves one Session rpc: an opening (`hello`) gets a session id and the
  // challenge; a confirmation (`session`, `proof`) an empty answer.
  // INVALID_ARGUMENT for a hello the handshake refuses or a worker outside
  // [-1, num_workers); UNAUTHENTICATED for a proof that does not hold or an
  // unknown (or evicted) opening.
  absl::StatusOr<proto::SessionResponse> Handle(
      const proto::SessionRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // Who a call carrying `call_auth` (the metadata value) is, as
  // TokenAuthenticator::Authenticate says: kAnyWorker for a session of the
  // job token, w for one of worker w's own. UNAUTHENTICATED for a value
  // that does not parse, an unknown session (say, of a server since
  // restarted), a MAC that does not hold, a sequence seen before or older
  // than the window.
  absl::StatusOr<int> Verify(absl::string_view call_auth,
                             absl::string_view method,
                             absl::string_view generation)
      ABSL_LOCKS_EXCLUDED(mu_);

  // For tests: openings awaiting their proof; confirmed sessions.
  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t confirmed() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Pending {
    Pending(const TokenAuthenticator* auth, int worker)
        : handshake(auth, std::string(kSessionTransport)), worker(worker) {}
    HelloServer handshake;
    int worker;
  };
  struct Session {
    int worker = 0;  // whom the hello named
    int caller = 0;  // whom the proof showed (TokenAuthenticator)
    std::string key;
    uint64_t highest = 0;  // the highest sequence accepted
    // Bit i: highest - i was accepted.
    std::bitset<kReplayWindow> seen;
  };

  absl::StatusOr<proto::SessionResponse> Open(const proto::BnHello& hello)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Confirm(uint64_t id, const proto::BnHelloProof& proof)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fresh id, not 0 and not in use.
  uint64_t NewId() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Accepts `sequence` into `s`'s window, or says why not.
  static absl::Status Accept(Session& s, uint64_t sequence);

  const TokenAuthenticator* const auth_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> pending_order_ ABSL_GUARDED_BY(mu_);  // oldest first
  std::map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  // Each worker's confirmed sessions, oldest first.
  std::map<int, std::deque<uint64_t>> by_worker_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::security

#endif  // BNPS_SECURITY_CALL_SESSION_H_
