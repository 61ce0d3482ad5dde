// SHA-256 (OpenSSL's, which gRPC already links), for digests that compare
// runs bit for bit (bnps_status --digest).
//
// Thread-safety: thread-safe.

#ifndef BNPS_UTIL_SHA256_H_
#define BNPS_UTIL_SHA256_H_

#include <string>

#include "absl/strings/string_view.h"

namespace bnps::util {

// Incremental hashing: Update any number of times, then Final (once).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(absl::string_view data);
  std::string Final();  // 32 bytes

 private:
  void* ctx_;  // EVP_MD_CTX, not exposed
};

// The 32-byte hash of `data`.
std::string Sha256Of(absl::string_view data);
// Lower-case hexadecimal.
std::string Hex(absl::string_view bytes);

}  // namespace bnps::util

#endif  // BNPS_UTIL_SHA256_H_
