// Reads the small files the binaries take by flag: PEM certificates and keys
// (security/credentials.h) and the job token (security/job_token.h), with errors
// that name the file and its role but never its contents.
//
// Example:
//   absl::StatusOr<std::string> pem =
//       ReadSmallFile("TLS key", "/etc/bnps/server.key", 1 << 20);
//   // NOT_FOUND: "TLS key '/etc/bnps/server.key': cannot read: No such file
//   // or directory"
//
// Thread-safety: thread-safe (no state; errno is read on the calling thread).

#ifndef BNPS_SECURITY_SMALL_FILE_H_
#define BNPS_SECURITY_SMALL_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bnps::security {

// The whole of the file at `path`. NOT_FOUND "<what> '<path>': cannot read:
// <reason>" if it cannot be opened or read (a directory, say);
// INVALID_ARGUMENT if it holds more than `max_bytes` bytes (only that many and
// one more are read).
absl::StatusOr<std::string> ReadSmallFile(absl::string_view what,
                                          const std::string& path,
                                          size_t max_bytes);

}  // namespace bnps::security

#endif  // BNPS_SECURITY_SMALL_FILE_H_
