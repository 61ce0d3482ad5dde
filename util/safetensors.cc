#include "util/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "util/json_string.h"

namespace bnps::util {
namespace {

int64_t ElementBytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F64" || dtype == "I64") return 8;
  return 0;
}

}  // namespace

absl::StatusOr<std::string> EncodeSafetensors(
    const std::map<std::string, SafeTensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::vector<std::string> fields;
  if (!metadata.empty()) {
    std::vector<std::string> kv;
    for (const auto& [k, v] : metadata) {
      kv.push_back(absl::StrCat(JsonString(k), ":", JsonString(v)));
    }
    fields.push_back(
        absl::StrCat("\"__metadata__\":{", absl::StrJoin(kv, ","), "}"));
  }
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t bytes = ElementBytes(t.dtype);
    if (name.empty() || name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: bad tensor name '", name, "'"));
    }
    if (bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' has unknown dtype '", t.dtype, "'"));
    }
    int64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "safetensors: tensor '", name, "' has a negative dimension"));
      }
      n *= d;
    }
    if (static_cast<int64_t>(t.data.size()) != n * bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' has ", t.data.size(),
          " bytes of data, not ", n * bytes));
    }
    fields.push_back(absl::StrCat(
        JsonString(name), ":{\"dtype\":\"", t.dtype, "\",\"shape\":[",
        absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset, ",",
        offset + n * bytes, "]}"));
    offset += n * bytes;
  }
  std::string header = absl::StrCat("{", absl::StrJoin(fields, ","), "}");
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + header.size() + offset);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  for (const auto& [name, t] : tensors) out += t.data;
  return out;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& bytes) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  auto fail = [&](const char* what) {
    const int e = errno;
    unlink(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot write ", path, " (", what, "): ", std::strerror(e)));
  };
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("open");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      close(fd);
      return fail("write");
    }
    done += static_cast<size_t>(w);
  }
  if (fsync(fd) != 0) {
    close(fd);
    return fail("fsync");
  }
  if (close(fd) != 0) return fail("close");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename");
  return absl::OkStatus();
}

}  // namespace bnps::util
