// JsonString: a string as a JSON string literal, for the few places that
// write JSON by hand (bnps_status --json, the safetensors header, the C
// ABI's job config). Quotes and backslashes are escaped, control bytes
// written as \uXXXX; bytes above 0x7f pass through (UTF-8, or opaque names
// a reader takes as they are). Thread-safe.

#ifndef BNPS_UTIL_JSON_STRING_H_
#define BNPS_UTIL_JSON_STRING_H_

#include <string>

#include "absl/strings/string_view.h"

namespace bnps::util {

std::string JsonString(absl::string_view s);

}  // namespace bnps::util

#endif  // BNPS_UTIL_JSON_STRING_H_
