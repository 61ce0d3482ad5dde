#include "security/small_file.h"

#include <cerrno>
#include <fstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace bnps::security {
namespace {

// Unlike strerror, std::error_code's message is safe on several threads.
std::string ErrnoText(int errno_value, absl::string_view otherwise) {
  if (errno_value == 0) return std::string(otherwise);
  return std::error_code(errno_value, std::generic_category()).message();
}

}  // namespace

absl::StatusOr<std::string> ReadSmallFile(absl::string_view what,
                                          const std::string& path,
                                          size_t max_bytes) {
  const std::string name = absl::StrCat(what, " '", path, "'");
  errno = 0;
  std::ifstream in(path, std::ios::in | std::ios::binary);
  if (!in.is_open()) {
    return absl::NotFoundError(
        absl::StrCat(name, ": cannot read: ", ErrnoText(errno, "open failed")));
  }
  std::string contents(max_bytes + 1, '\0');
  in.read(contents.data(), static_cast<std::streamsize>(contents.size()));
  // bad(): the read itself failed, e.g. EISDIR for a directory (which opens).
  if (in.bad()) {
    return absl::NotFoundError(
        absl::StrCat(name, ": cannot read: ", ErrnoText(errno, "read failed")));
  }
  contents.resize(static_cast<size_t>(in.gcount()));
  if (contents.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has more than ", max_bytes, " bytes"));
  }
  return contents;
}

}  // namespace bnps::security
