// Text that came from outside the process (a client's job name, a key, a
// status message that quotes them), made safe to put in a log line: whatever
// the bytes, the result is printable ASCII, so a client cannot end a log line
// and forge the next one, nor send raw invalid UTF-8 or terminal escapes.
//
// Printable ASCII other than the backslash passes unchanged; '\\' becomes
// "\\\\", newline, carriage return and tab become "\\n", "\\r", "\\t", and
// every other byte (other control characters, DEL, any byte >= 0x80, so also
// UTF-8 beyond ASCII) becomes "\\xNN". The escaping is unambiguous: a client
// cannot make escaped text look like an escape. (absl::CHexEscape would do
// the same but also escape quotes, which the log's quoted keys read worse
// with.)
//
// Example:
//   std::fprintf(stderr, "rejected: %s\n", EscapeForLog(s.ToString()).c_str());
//
// Thread-safety: a pure function.

#ifndef BNPS_UTIL_LOG_ESCAPE_H_
#define BNPS_UTIL_LOG_ESCAPE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace bnps::util {

std::string EscapeForLog(absl::string_view text);

}  // namespace bnps::util

#endif  // BNPS_UTIL_LOG_ESCAPE_H_
