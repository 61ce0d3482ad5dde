// The per-job token: a shared secret that every call of a job proves, and
// that a server configured with a token checks before it looks at the
// request. It keeps other jobs and strangers from pushing into a job's
// parameters. Over TLS (security/credentials.h) a call carries it in the
// metadata entry kTokenMetadataKey; without TLS it never crosses the wire:
// calls run under a session (security/call_session.h) and the BN hellos
// prove it (security/bn_handshake.h).
//
// A token is 16 to 4096 printable ASCII characters without spaces (gRPC
// metadata values must be printable); a token file holds one, and a single
// trailing newline is ignored.
//
// Example:
//   absl::StatusOr<std::string> token = ReadTokenFile("/run/secrets/token");
//   if (!token.ok()) return token.status();
//   context.AddMetadata(std::string(kTokenMetadataKey), *token);
//   ...
//   // the value of the call's bnps-token metadata, std::nullopt if it has
//   // none:
//   if (absl::Status s = CheckToken(*token, call_token); !s.ok()) ...
//
// Thread-safety: pure functions.

#ifndef BNPS_SECURITY_JOB_TOKEN_H_
#define BNPS_SECURITY_JOB_TOKEN_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bnps::security {

// The metadata key (lower case, as gRPC requires).
inline constexpr absl::string_view kTokenMetadataKey = "bnps-token";
inline constexpr size_t kMinTokenBytes = 16;
inline constexpr size_t kMaxTokenBytes = 4096;

// OK if `token` is a valid token; INVALID_ARGUMENT saying why otherwise.
absl::Status ValidateToken(absl::string_view token);

// FAILED_PRECONDITION, saying the chmod to run, if the file at `path` may be
// written by every user, or is this user's own and readable by every user
// (a file of another owner, as a container's mounted secret, may be: that
// owner chose). OK if it cannot be looked at (reading it will say why).
absl::Status CheckTokenFileMode(const std::string& path);

// Reads the token in `path`, checked by CheckTokenFileMode first. NOT_FOUND
// if the file cannot be read; INVALID_ARGUMENT (naming the path, never
// echoing its contents) if it does not hold a valid token.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Checks the token a call carried (nullopt: none) against the job's. An
// empty `expected` accepts every call. UNAUTHENTICATED if the token is
// missing or differs. The comparison takes the same time wherever the two
// differ, so timing does not reveal a prefix.
absl::Status CheckToken(absl::string_view expected,
                        std::optional<absl::string_view> got);

}  // namespace bnps::security

#endif  // BNPS_SECURITY_JOB_TOKEN_H_
