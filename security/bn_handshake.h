// The BN hello's handshake (proto BnHello / BnHelloReply / BnHelloProof):
// how the raw-TCP and Unix BN connections (server/bn_socket_server.h,
// client/internal/bn_socket.h, hostbn/aggregator.h) authenticate without
// the token ever crossing the wire.
//
// In a job with a token: the client sends its hello with a fresh nonce; the
// server answers with its own nonce and its proofs that it holds the key
// (under the job token, and under the hello's worker's own token with
// per-worker tokens); the client checks one of them BEFORE it says
// anything else, then sends its proof; the server checks it and gives the
// final answer. Each proof is HMAC-SHA256 of the key over the role and the
// transcript: the job, the generation, the workers, the upstream, the
// transport ("tcp" or "unix") and both nonces. So a planted listener, a
// fake shard behind an aggregator or a recording learns nothing it can use:
// it cannot prove itself without the key, a proof is bound to the nonces of
// one connection, and HMAC does not give its key away. Without a token the
// first reply is final; a client that holds a token refuses a server that
// does not prove itself.
//
// What this does not do: encrypt or authenticate the frames after the
// hello (an active man-in-the-middle who relays the handshake may then
// alter BN requests). TLS covers the gRPC calls; the raw BN listener is
// for a trusted network or a Unix socket.
//
// Thread-safety: HelloClient and HelloServer are for one connection's
// thread; the functions are stateless.

#ifndef BNPS_SECURITY_BN_HANDSHAKE_H_
#define BNPS_SECURITY_BN_HANDSHAKE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/bnps.pb.h"
#include "security/worker_token.h"

namespace bnps::security {

inline constexpr size_t kHelloNonceBytes = 32;

// kHelloNonceBytes bytes from the system's random source.
std::string NewHelloNonce();

// What both sides prove: `hello`'s identity fields and nonce, the
// transport and the server's nonce, encoded without ambiguity.
std::string HelloTranscript(const proto::BnHello& hello,
                            absl::string_view transport,
                            absl::string_view server_nonce);

class HelloClient {
 public:
  // `hello`: the identity to say hello as (its token and nonce are set
  // here: none, and a fresh one). `token`: the job's or this worker's own;
  // empty for a job without one. `where` names the server in errors.
  HelloClient(proto::BnHello hello, std::string token, std::string transport,
              std::string where);

  const proto::BnHello& hello() const { return hello_; }

  // The server's first reply. A challenge whose proof holds: the proof to
  // send. A final reply: nullopt if it says OK (and the client holds no
  // token: a server that does not prove itself is refused, UNAUTHENTICATED),
  // or its error. UNAUTHENTICATED if the server's proof does not hold (a
  // listener that is not the job's), or the job needs a token this client
  // does not have.
  absl::StatusOr<std::optional<proto::BnHelloProof>> OnFirstReply(
      const proto::BnHelloReply& reply) const;

 private:
  proto::BnHello hello_;
  const std::string token_;
  const std::string transport_;
  const std::string where_;
};

class HelloServer {
 public:
  // `auth` (not owned) must outlive this.
  HelloServer(const TokenAuthenticator* auth, std::string transport)
      : auth_(auth), transport_(std::move(transport)) {}

  // The first reply to `hello` (code OK): a challenge if the job has a
  // token, else final (the caller then admits as TokenAuthenticator::
  // kAnyWorker). INVALID_ARGUMENT for a hello that carries a token (an
  // older client: the token would have crossed the wire) or no nonce.
  absl::StatusOr<proto::BnHelloReply> Begin(const proto::BnHello& hello);

  // Whether Begin sent a challenge that Finish must settle.
  bool awaiting_proof() const { return !transcript_.empty(); }
  // What Begin's challenge bound (HelloTranscript); empty before it. A gRPC
  // session derives its key from it (security/call_session.h).
  const std::string& transcript() const { return transcript_; }

  // Who the client's proof shows the caller is (as
  // TokenAuthenticator::AuthenticateProof); UNAUTHENTICATED if it does not
  // hold.
  absl::StatusOr<int> Finish(const proto::BnHelloProof& proof) const;

 private:
  const TokenAuthenticator* const auth_;
  const std::string transport_;
  int worker_ = 0;
  std::string transcript_;
};

}  // namespace bnps::security

#endif  // BNPS_SECURITY_BN_HANDSHAKE_H_
