#include "security/worker_token.h"

#include <openssl/evp.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "security/job_token.h"
#include "util/sha256.h"

namespace bnps::security {

namespace {

// The hex of HMAC-SHA256(key, message).
std::string HexHmac(absl::string_view key, absl::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       mac, &n);
  return util::Hex(absl::string_view(reinterpret_cast<const char*>(mac), n));
}

}  // namespace

std::string WorkerToken(absl::string_view job_token, int worker) {
  return HexHmac(job_token, absl::StrCat("worker:", worker));
}

std::string Seal(absl::string_view job_token, absl::string_view message) {
  return HexHmac(job_token, absl::StrCat("seal:", message));
}

bool SealMatches(absl::string_view job_token, absl::string_view message,
                 absl::string_view seal) {
  const std::string want = Seal(job_token, message);
  return seal.size() == want.size() &&
         CRYPTO_memcmp(seal.data(), want.data(), want.size()) == 0;
}

std::string HandshakeProof(absl::string_view key, absl::string_view role,
                           absl::string_view transcript) {
  const std::string message = absl::StrCat("bnps-hello:", role, "\n", transcript);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       mac, &n);
  return std::string(reinterpret_cast<const char*>(mac), n);
}

bool HandshakeProofMatches(absl::string_view key, absl::string_view role,
                           absl::string_view transcript, absl::string_view proof) {
  const std::string want = HandshakeProof(key, role, transcript);
  return proof.size() == want.size() &&
         CRYPTO_memcmp(proof.data(), want.data(), want.size()) == 0;
}

std::string SessionKey(absl::string_view key, absl::string_view transcript) {
  return HandshakeProof(key, "session", transcript);
}

TokenAuthenticator::TokenAuthenticator(std::string job_token, bool per_worker,
                                       int num_workers)
    : job_token_(std::move(job_token)),
      per_worker_(per_worker && !job_token_.empty()),
      num_workers_(num_workers) {
  if (!per_worker_) return;
  for (int w = 0; w < num_workers; ++w) {
    workers_.emplace(util::Sha256Of(WorkerToken(job_token_, w)), w);
  }
}

absl::StatusOr<int> TokenAuthenticator::Authenticate(
    std::optional<absl::string_view> token) const {
  if (job_token_.empty()) return kAnyWorker;
  absl::Status job = CheckToken(job_token_, token);
  if (job.ok()) return kAnyWorker;
  if (per_worker_ && token.has_value()) {
    auto it = workers_.find(util::Sha256Of(*token));
    if (it != workers_.end()) return it->second;
  }
  if (!per_worker_) return job;
  return absl::UnauthenticatedError(
      token.has_value()
          ? "the call's token is neither the job token nor a worker's "
            "(per-worker tokens: bnps_worker_token derives them)"
          : "the call carries no token; this job requires one (each worker "
            "its own)");
}

void TokenAuthenticator::ServerProofs(int worker, absl::string_view transcript,
                                      std::string* job_proof,
                                      std::string* worker_proof) const {
  job_proof->clear();
  worker_proof->clear();
  if (job_token_.empty()) return;
  *job_proof = HandshakeProof(job_token_, "server", transcript);
  if (per_worker_ && worker >= 0 && worker < num_workers_) {
    *worker_proof =
        HandshakeProof(WorkerToken(job_token_, worker), "server", transcript);
  }
}

absl::StatusOr<int> TokenAuthenticator::AuthenticateProof(
    int worker, absl::string_view transcript, absl::string_view proof) const {
  if (job_token_.empty()) return kAnyWorker;
  if (HandshakeProofMatches(job_token_, "client", transcript, proof)) {
    return kAnyWorker;
  }
  if (per_worker_ && worker >= 0 && worker < num_workers_ &&
      HandshakeProofMatches(WorkerToken(job_token_, worker), "client",
                            transcript, proof)) {
    return worker;
  }
  return absl::UnauthenticatedError(
      per_worker_ ? absl::StrCat("the hello's proof is neither the job token's "
                                 "nor worker ", worker, "'s own token's")
                  : std::string("wrong job token (the hello's proof does not "
                                "hold)"));
}

std::string TokenAuthenticator::SessionKeyOf(
    int who, absl::string_view transcript) const {
  if (who == kAnyWorker) return SessionKey(job_token_, transcript);
  return SessionKey(WorkerToken(job_token_, who), transcript);
}

}  // namespace bnps::security
