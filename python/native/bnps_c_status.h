// The C ABI's error reporting (python/native/bnps_c.h, "Conventions"): a
// status becomes its code and its message in the caller's `err` buffer.
// Shared by every bnps_c*.cc; not part of the ABI.

#ifndef BNPS_PYTHON_NATIVE_BNPS_C_STATUS_H_
#define BNPS_PYTHON_NATIVE_BNPS_C_STATUS_H_

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "absl/status/status.h"

namespace bnps::c_abi {

// The status code of `s` (0 for OK); its message into `err` (`err_len`
// bytes, NUL-terminated, truncated to fit; `err` may be null).
inline int Fail(const absl::Status& s, char* err, size_t err_len) {
  if (err != nullptr && err_len > 0) {
    const std::string m(s.message());
    const size_t n = std::min(m.size(), err_len - 1);
    std::memcpy(err, m.data(), n);
    err[n] = '\0';
  }
  return s.ok() ? 0 : static_cast<int>(s.code());
}

inline std::string Str(const char* s) { return s == nullptr ? "" : s; }

}  // namespace bnps::c_abi

// In a C ABI function with `err` and `err_len` parameters: returns the code
// of a failed `expr`.
#define BNPS_RETURN_IF_ERROR(expr)                                  \
  do {                                                              \
    absl::Status s_ = (expr);                                       \
    if (!s_.ok()) return ::bnps::c_abi::Fail(s_, err, err_len);     \
  } while (0)

#endif  // BNPS_PYTHON_NATIVE_BNPS_C_STATUS_H_
