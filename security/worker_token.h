// Per-worker tokens: each worker of a job its own identity.
//
// Worker w's token is the lower-case hex of HMAC-SHA256(job token,
// "worker:<w>") -- 64 characters, a valid token (security/job_token.h).
// Whoever holds the job token (the servers, the operator) can derive every
// worker's; a worker holding only its own cannot derive another's, nor the
// job token. HMAC over a shared secret was chosen over mutual-TLS client
// certificates because the raw-TCP BN connection is plaintext (it carries
// the token in its hello, not a certificate), so a certificate could not
// bind it; a derived token binds both transports the same way and needs no
// certificate authority, only the secret every server already holds. The
// raw BN connection no longer carries the token itself: each side proves it
// holds its key (HandshakeProof; security/bn_handshake.h).
//
// TokenAuthenticator says who a call's token proves the caller is: with
// per-worker tokens on, worker w's token acts as worker w only; the job
// token acts as any worker (the operator's, and the tools' key). Without
// them, only the job token is accepted, as any worker.
//
// Example:
//   TokenAuthenticator auth(job_token, /*per_worker=*/true, num_workers);
//   absl::StatusOr<int> caller = auth.Authenticate(call_token);
//   if (!caller.ok()) return caller.status();        // UNAUTHENTICATED
//   ... shard->CheckCaller(req.job(), req.worker(), *caller) ...
//
// Thread-safety: WorkerToken is a pure function; a TokenAuthenticator is
// immutable after construction and safe to share.

#ifndef BNPS_SECURITY_WORKER_TOKEN_H_
#define BNPS_SECURITY_WORKER_TOKEN_H_

#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bnps::security {

// Worker `worker`'s token under `job_token` (64 hexadecimal characters).
std::string WorkerToken(absl::string_view job_token, int worker);

// A seal the servers put on what they tell each other through the workers
// (a shard's loss news, proto's WorkerLoss): the hex of HMAC-SHA256(job
// token, "seal:" + message). A worker holding only its own token can
// neither make one nor learn the job token from one; the "seal:" prefix
// keeps every seal apart from every worker's token.
std::string Seal(absl::string_view job_token, absl::string_view message);
// Whether `seal` is Seal(job_token, message), compared in constant time.
bool SealMatches(absl::string_view job_token, absl::string_view message,
                 absl::string_view seal);

// A proof that the holder of `key` took part in the handshake whose
// transcript is `transcript`, as `role` ("server" or "client"): the raw
// HMAC-SHA256(key, "bnps-hello:" + role + "\n" + transcript), 32 bytes.
std::string HandshakeProof(absl::string_view key, absl::string_view role,
                           absl::string_view transcript);
// Whether `proof` is HandshakeProof(key, role, transcript), in constant time.
bool HandshakeProofMatches(absl::string_view key, absl::string_view role,
                           absl::string_view transcript, absl::string_view proof);

// The key of a session opened by the handshake whose transcript is
// `transcript` (security/call_session.h): HandshakeProof(key, "session",
// transcript), which neither proof on the wire reveals.
std::string SessionKey(absl::string_view key, absl::string_view transcript);

class TokenAuthenticator {
 public:
  // What Authenticate returns for a caller that may act as any worker.
  static constexpr int kAnyWorker = -1;

  // `job_token` empty: every call is accepted, as any worker (and
  // `per_worker` must be false). `num_workers`: the job's workers, whose
  // tokens are accepted when `per_worker`.
  TokenAuthenticator(std::string job_token, bool per_worker, int num_workers);

  // kAnyWorker for the job token (or when no token is required); w for
  // worker w's token (per-worker tokens on). UNAUTHENTICATED for a missing
  // or unknown token; the job token is compared in constant time, and a
  // worker's is looked up by its SHA-256, so timing reveals no prefix.
  absl::StatusOr<int> Authenticate(
      std::optional<absl::string_view> token) const;

  bool per_worker() const { return per_worker_; }
  // Whether callers must prove a token (the job has one).
  bool required() const { return !job_token_.empty(); }

  // The server's proofs for a handshake (`transcript`) whose hello named
  // `worker`: under the job token, and (per-worker tokens, a worker of the
  // job) under that worker's own, empty otherwise. A client holding either
  // checks one of them.
  void ServerProofs(int worker, absl::string_view transcript,
                    std::string* job_proof, std::string* worker_proof) const;
  // Who the client's `proof` shows the caller is: kAnyWorker for the job
  // token's, `worker` for that worker's own (per-worker tokens on), as
  // Authenticate. UNAUTHENTICATED otherwise; kAnyWorker if none is required.
  absl::StatusOr<int> AuthenticateProof(int worker, absl::string_view transcript,
                                        absl::string_view proof) const;
  // SessionKey under the key of `who`, as AuthenticateProof returned it:
  // the job token's for kAnyWorker, else worker `who`'s own.
  // REQUIRES: required().
  std::string SessionKeyOf(int who, absl::string_view transcript) const;

 private:
  const std::string job_token_;
  const bool per_worker_;
  const int num_workers_;
  // SHA-256 of each worker's token -> the worker.
  absl::flat_hash_map<std::string, int> workers_;
};

}  // namespace bnps::security

#endif  // BNPS_SECURITY_WORKER_TOKEN_H_
