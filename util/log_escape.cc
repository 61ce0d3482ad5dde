#include "util/log_escape.h"

namespace bnps::util {

std::string EscapeForLog(absl::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
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
