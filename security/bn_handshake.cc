#include "security/bn_handshake.h"

#include <openssl/rand.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace bnps::security {
namespace {

// A length-prefixed field: no two transcripts encode alike.
void Field(std::string* out, absl::string_view name, absl::string_view value) {
  absl::StrAppend(out, name, "=", value.size(), ":", value, ";");
}

}  // namespace

std::string NewHelloNonce() {
  std::string nonce(kHelloNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&nonce[0]),
                 static_cast<int>(nonce.size())) != 1) {
    std::abort();  // no randomness: nothing safe to go on with
  }
  return nonce;
}

std::string HelloTranscript(const proto::BnHello& hello,
                            absl::string_view transport,
                            absl::string_view server_nonce) {
  std::string t;
  Field(&t, "job", hello.job());
  Field(&t, "worker", absl::StrCat(hello.worker()));
  std::string workers;
  for (int w : hello.workers()) absl::StrAppend(&workers, w, ",");
  Field(&t, "workers", workers);
  Field(&t, "generation", absl::StrCat(hello.generation()));
  Field(&t, "upstream", hello.upstream());
  Field(&t, "transport", transport);
  Field(&t, "client_nonce", hello.client_nonce());
  Field(&t, "server_nonce", server_nonce);
  return t;
}

HelloClient::HelloClient(proto::BnHello hello, std::string token,
                         std::string transport, std::string where)
    : hello_(std::move(hello)),
      token_(std::move(token)),
      transport_(std::move(transport)),
      where_(std::move(where)) {
  hello_.clear_token();
  hello_.set_client_nonce(NewHelloNonce());
}

absl::StatusOr<std::optional<proto::BnHelloProof>> HelloClient::OnFirstReply(
    const proto::BnHelloReply& reply) const {
  if (!reply.challenge()) {
    if (reply.code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(reply.code()),
                          reply.message());
    }
    if (!token_.empty()) {
      return absl::UnauthenticatedError(absl::StrCat(
          where_, " accepted the hello without proving it holds the job's "
          "key: not this job's server (a planted listener?); nothing was "
          "sent to it"));
    }
    return std::nullopt;
  }
  if (token_.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the job at ", where_, " requires a token (--token_file)"));
  }
  const std::string transcript =
      HelloTranscript(hello_, transport_, reply.server_nonce());
  const bool proven =
      HandshakeProofMatches(token_, "server", transcript, reply.job_proof()) ||
      HandshakeProofMatches(token_, "server", transcript, reply.worker_proof());
  if (!proven) {
    return absl::UnauthenticatedError(absl::StrCat(
        where_, " could not prove it holds this job's key (another job's "
        "server; a wrong token, such as another worker's own token for "
        "worker ", hello_.worker(), "; or a planted listener); nothing was "
        "sent to it"));
  }
  proto::BnHelloProof proof;
  proof.set_proof(HandshakeProof(token_, "client", transcript));
  return std::optional<proto::BnHelloProof>(std::move(proof));
}

absl::StatusOr<proto::BnHelloReply> HelloServer::Begin(const proto::BnHello& hello) {
  if (!hello.token().empty()) {
    return absl::InvalidArgumentError(
        "a BN hello carries no token (it would cross the wire): this client "
        "is older than the server; upgrade it");
  }
  if (hello.client_nonce().size() != kHelloNonceBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a BN hello needs a nonce of ", kHelloNonceBytes, " bytes"));
  }
  proto::BnHelloReply reply;
  if (!auth_->required()) return reply;
  worker_ = hello.worker();
  reply.set_challenge(true);
  reply.set_server_nonce(NewHelloNonce());
  transcript_ = HelloTranscript(hello, transport_, reply.server_nonce());
  auth_->ServerProofs(worker_, transcript_, reply.mutable_job_proof(),
                      reply.mutable_worker_proof());
  return reply;
}

absl::StatusOr<int> HelloServer::Finish(const proto::BnHelloProof& proof) const {
  if (transcript_.empty()) {
    return absl::FailedPreconditionError("no challenge to answer");
  }
  return auth_->AuthenticateProof(worker_, transcript_, proof.proof());
}

}  // namespace bnps::security
