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
// The result is also bounded: past `max_bytes` of output the text is cut
// and "...[N more bytes]" (N bytes of the input left out) ends it, so a
// client cannot write a line of megabytes (a 1 MiB layer name wrote a
// 4 MiB line).
//
// Example:
//   std::fprintf(stderr, "rejected: %s\n", EscapeForLog(s.ToString()).c_str());
//
// Thread-safety: a pure function.

#ifndef BNPS_UTIL_LOG_ESCAPE_H_
#define BNPS_UTIL_LOG_ESCAPE_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace bnps::util {

// The longest escaped text EscapeForLog returns by default, before its
// marker.
inline constexpr size_t kMaxLogTextBytes = 2048;

std::string EscapeForLog(absl::string_view text,
                         size_t max_bytes = kMaxLogTextBytes);

}  // namespace bnps::util

#endif  // BNPS_UTIL_LOG_ESCAPE_H_
