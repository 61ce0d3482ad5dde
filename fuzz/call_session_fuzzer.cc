// Fuzzes what a gRPC session (security/call_session.h) reads from the
// network. The first byte picks the reader; the rest is its input:
//   0: a call's kCallAuthMetadataKey value, parsed (what parses must format
//      and parse back the same) and verified against a server holding a
//      real session: no made-up value may ever verify;
//   1: a SessionRequest the server handles (an opening or a confirmation):
//      no made-up proof may ever confirm a session, and the openings stay
//      within their pool;
//   2: a SessionResponse a client takes as the server's challenge: the
//      client's nonce is fresh, so no reply made before it can prove.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "proto/bnps.pb.h"
#include "security/call_session.h"
#include "security/worker_token.h"

namespace {

constexpr char kToken[] = "fuzz-job-token-0123456789";
constexpr char kMethod[] = "/bnps.proto.ParameterServer/Heartbeat";

struct Server {
  Server() : auth(kToken, /*per_worker=*/true, 4), table(&auth, {4, 16, 4}) {
    bnps::security::SessionOpener opener("bnps", 0, kToken, "fuzz");
    auto challenge = table.Handle(opener.Open());
    if (!challenge.ok()) std::abort();
    auto confirm = opener.OnChallenge(*challenge);
    if (!confirm.ok() || !table.Handle(*confirm).ok()) std::abort();
    session = opener.Confirmed();
    if (!table.Verify(session->Sign(kMethod, "0"), kMethod, "0").ok()) {
      std::abort();
    }
  }
  bnps::security::TokenAuthenticator auth;
  bnps::security::SessionTable table;
  std::unique_ptr<bnps::security::ClientSession> session;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static Server* const server = new Server();
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0: {
      absl::StatusOr<bnps::security::CallAuth> auth =
          bnps::security::ParseCallAuth(bytes);
      if (auth.ok()) {
        absl::StatusOr<bnps::security::CallAuth> back =
            bnps::security::ParseCallAuth(bnps::security::FormatCallAuth(*auth));
        if (!back.ok() || back->session != auth->session ||
            back->sequence != auth->sequence || back->mac != auth->mac) {
          std::abort();
        }
      }
      if (server->table.Verify(bytes, kMethod, "0").ok()) std::abort();
      break;
    }
    case 1: {
      bnps::proto::SessionRequest req;
      if (!req.ParseFromString(bytes)) break;
      const size_t before = server->table.confirmed();
      absl::StatusOr<bnps::proto::SessionResponse> r = server->table.Handle(req);
      if (!req.has_hello() && r.ok()) std::abort();  // a made-up proof held
      if (server->table.confirmed() != before) std::abort();
      if (server->table.pending() > 16) std::abort();
      break;
    }
    default: {
      bnps::proto::SessionResponse resp;
      if (!resp.ParseFromString(bytes)) break;
      bnps::security::SessionOpener opener("bnps", 0, kToken, "fuzz");
      if (opener.OnChallenge(resp).ok()) std::abort();
      break;
    }
  }
  return 0;
}
