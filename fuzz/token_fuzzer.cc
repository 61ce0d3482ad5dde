// Fuzzes the job token checks: arbitrary bytes as a token (validated as a
// token file's contents are) and as the token a call carries in its
// metadata, checked against the job's. A valid token must accept itself and
// refuse anything else.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "security/job_token.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (bnps::security::ValidateToken(bytes).ok()) {
    if (!bnps::security::CheckToken(bytes, bytes).ok()) std::abort();
    if (bnps::security::CheckToken(bytes, std::string(bytes) + "x").ok()) {
      std::abort();
    }
    if (bnps::security::CheckToken(bytes, std::nullopt).ok()) std::abort();
  }
  if (bnps::security::CheckToken("0123456789abcdef0123", bytes).ok() &&
      bytes != "0123456789abcdef0123") {
    std::abort();
  }
  return 0;
}
