#include "security/job_token.h"

#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "security/small_file.h"

namespace bnps::security {

absl::Status ValidateToken(absl::string_view token) {
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job token must have ", kMinTokenBytes, " to ",
                     kMaxTokenBytes, " characters, not ", token.size()));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a job token must be printable ASCII without spaces; character ", i,
          " is not"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTokenFileMode(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::OkStatus();  // read says
  const unsigned mode = st.st_mode & 07777;
  auto refused = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "job token file '%s' (mode %04o) %s: chmod 600 '%s' (or 640 for a "
        "group that must read it)", path, mode, why, path));
  };
  if ((st.st_mode & S_IWOTH) != 0) {
    return refused("may be replaced by any user");
  }
  // Like ssh with a private key: an owner who left the secret readable to
  // every user is told. A file of another owner (a container's mounted
  // secret, read through its group or other bits) is what that owner chose.
  if ((st.st_mode & S_IROTH) != 0 && st.st_uid == ::geteuid()) {
    return refused("is readable by every user");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  if (absl::Status s = CheckTokenFileMode(path); !s.ok()) return s;
  // A token, and the newline an editor or `echo` puts after it.
  absl::StatusOr<std::string> token =
      ReadSmallFile("job token file", path, kMaxTokenBytes + 1);
  if (!token.ok()) return token.status();
  if (!token->empty() && token->back() == '\n') token->pop_back();
  if (absl::Status s = ValidateToken(*token); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job token file '", path, "': ", s.message()));
  }
  return token;
}

absl::Status CheckToken(absl::string_view expected,
                        std::optional<absl::string_view> got) {
  if (expected.empty()) return absl::OkStatus();
  if (!got.has_value()) {
    return absl::UnauthenticatedError(
        absl::StrCat("this job requires a token: the call carried no '",
                     kTokenMetadataKey, "' metadata (--token_file)"));
  }
  // Every byte of the expected token is compared, whatever the length of the
  // one sent.
  unsigned char diff = got->size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const char g = i < got->size() ? (*got)[i] : 0;
    diff |= static_cast<unsigned char>(g ^ expected[i]);
  }
  if (diff != 0) {
    return absl::UnauthenticatedError("wrong job token");
  }
  return absl::OkStatus();
}

}  // namespace bnps::security
