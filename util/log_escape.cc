#include "util/log_escape.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace bnps::util {

std::string EscapeForLog(absl::string_view text, size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 32);
  for (size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= max_bytes) {
      absl::StrAppend(&out, "...[", text.size() - i, " more bytes]");
      break;
    }
    const char c = text[i];
    const unsigned char b = static_cast<unsigned char>(c);
    switch (b) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (b >= 0x20 && b < 0x7f) {
          out += c;
        } else {
          out += "\\x";
          out += kHex[b >> 4];
          out += kHex[b & 0xf];
        }
    }
  }
  return out;
}

}  // namespace bnps::util
