// Per-worker tokens: each worker of a job its own identity (issue 34).
//
// Worker w's token is the lower-case hex of HMAC-SHA256(job token,
// "worker:<w>") -- 64 characters, a valid token (security/job_token.h).
// Whoever holds the job token (the servers, the operator) can derive every
// worker's; a worker holding only its own cannot derive another's, nor the
// job token. HMAC over a shared secret was chosen over mutual-TLS client
// certificates because the raw-TCP BN connection is plaintext (it carries
// the token in its hello, not a certificate), so a certificate could not
// bind it; a derived token binds both transports the same way and needs no
// certificate authority, only the secret every server already holds.
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

 private:
  const std::string job_token_;
  const bool per_worker_;
  // SHA-256 of each worker's token -> the worker.
  absl::flat_hash_map<std::string, int> workers_;
};

}  // namespace bnps::security

#endif  // BNPS_SECURITY_WORKER_TOKEN_H_
