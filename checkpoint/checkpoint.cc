#include "checkpoint/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace bnps::checkpoint {
namespace {

constexpr char kMagic[8] = {'B', 'N', 'P', 'S', 'C', 'K', 'P', 'T'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 8 + 8 + 4;
constexpr char kPrefix[] = "ckpt-";
constexpr char kSuffix[] = ".bnps";

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return v;
}

uint32_t Crc(const std::string& s) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed large payloads in pieces.
  size_t done = 0;
  while (done < s.size()) {
    const size_t n = std::min<size_t>(s.size() - done, size_t{1} << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(s.data() + done),
                static_cast<uInt>(n));
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FsyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return Errno("cannot open", path);
  const int r = ::fsync(fd);
  ::close(fd);
  if (r != 0) return Errno("cannot fsync", path);
  return absl::OkStatus();
}

}  // namespace

absl::Status CreateCheckpointDir(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("no checkpoint directory");
  // Each missing level in turn, as mkdir -p.
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string level = dir.substr(0, end);
    if (::mkdir(level.c_str(), 0755) != 0 && errno != EEXIST) {
      return Errno("cannot create directory", level);
    }
    if (end == std::string::npos) break;
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return Errno("cannot create directory", dir);
  if (!S_ISDIR(st.st_mode)) {
    return absl::InternalError(absl::StrCat("cannot create directory ", dir,
                                            ": it is not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return Errno("cannot write to", dir);
  return absl::OkStatus();
}

std::string CheckpointPath(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/%s%012d%s", dir, kPrefix, step, kSuffix);
}

absl::Status WriteCheckpoint(const std::string& dir, int64_t step,
                             const std::string& payload, int keep) {
  if (dir.empty()) return absl::InvalidArgumentError("no checkpoint directory");
  if (step < 0) return absl::InvalidArgumentError("negative checkpoint step");
  if (absl::Status s = CreateCheckpointDir(dir); !s.ok()) return s;
  std::string header(kMagic, sizeof(kMagic));
  PutLe(&header, kFormatVersion, 4);
  PutLe(&header, static_cast<uint64_t>(step), 8);
  PutLe(&header, payload.size(), 8);
  PutLe(&header, Crc(payload), 4);

  const std::string path = CheckpointPath(dir, step);
  const std::string tmp = absl::StrCat(path, ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  absl::Status s = WriteAll(fd, header, tmp);
  if (s.ok()) s = WriteAll(fd, payload, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("cannot fsync", tmp);
  if (::close(fd) != 0 && s.ok()) s = Errno("cannot close", tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = Errno("cannot rename into place", tmp);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  if (absl::Status d = FsyncPath(dir, O_RDONLY | O_DIRECTORY); !d.ok()) return d;

  absl::StatusOr<std::vector<int64_t>> steps = ListCheckpoints(dir);
  if (!steps.ok()) return steps.status();
  for (size_t i = std::max(keep, 1); i < steps->size(); ++i) {
    const std::string old = CheckpointPath(dir, (*steps)[i]);
    if (::unlink(old.c_str()) != 0 && errno != ENOENT) {
      return Errno("cannot remove old checkpoint", old);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ListCheckpoints(const std::string& dir) {
  std::vector<int64_t> steps;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return steps;
    return Errno("cannot list", dir);
  }
  while (const dirent* e = ::readdir(d)) {
    absl::string_view name = e->d_name;
    if (!absl::ConsumePrefix(&name, kPrefix) ||
        !absl::ConsumeSuffix(&name, kSuffix)) {
      continue;
    }
    int64_t step;
    if (absl::SimpleAtoi(name, &step) && step >= 0) steps.push_back(step);
  }
  ::closedir(d);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

absl::StatusOr<CheckpointFile> ReadCheckpoint(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no file ", path));
    return Errno("cannot open", path);
  }
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.append(buf, n);
  const bool error = std::ferror(f);
  std::fclose(f);
  if (error) return Errno("cannot read", path);
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", why));
  };
  if (data.size() < kHeaderBytes) {
    return bad(absl::StrCat("torn: ", data.size(), " bytes, shorter than the header"));
  }
  if (std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    return bad("not a bnps checkpoint (bad magic)");
  }
  const char* h = data.data() + sizeof(kMagic);
  const uint32_t version = static_cast<uint32_t>(GetLe(h, 4));
  if (version != kFormatVersion) {
    return bad(absl::StrCat("format version ", version, ", this server reads ",
                            kFormatVersion));
  }
  CheckpointFile file;
  file.step = static_cast<int64_t>(GetLe(h + 4, 8));
  const uint64_t length = GetLe(h + 12, 8);
  const uint32_t crc = static_cast<uint32_t>(GetLe(h + 20, 4));
  if (data.size() - kHeaderBytes != length) {
    return bad(absl::StrCat("torn: payload of ", data.size() - kHeaderBytes,
                            " bytes, the header says ", length));
  }
  file.payload = data.substr(kHeaderBytes);
  if (Crc(file.payload) != crc) return bad("checksum mismatch");
  file.path = path;
  return file;
}

std::string SetAside(const std::string& path) {
  const std::string aside = absl::StrCat(path, ".bad");
  if (::rename(path.c_str(), aside.c_str()) != 0) {
    return absl::StrCat("(not: ", std::strerror(errno), ")");
  }
  return aside;
}

absl::StatusOr<CheckpointFile> LoadNewestCheckpoint(
    const std::string& dir, const std::string& log_prefix) {
  absl::StatusOr<std::vector<int64_t>> steps = ListCheckpoints(dir);
  if (!steps.ok()) return steps.status();
  for (int64_t step : *steps) {
    const std::string path = CheckpointPath(dir, step);
    absl::StatusOr<CheckpointFile> f = ReadCheckpoint(path);
    if (f.ok() && f->step == step) return f;
    if (!f.ok() && !absl::IsDataLoss(f.status())) return f.status();
    const std::string aside = SetAside(path);
    std::fprintf(stderr,
                 "%s: checkpoint %s is bad (%s); set aside as %s; trying the "
                 "previous one\n",
                 log_prefix.c_str(), path.c_str(),
                 f.ok() ? "its header names another step"
                        : std::string(f.status().message()).c_str(),
                 aside.c_str());
  }
  return absl::NotFoundError(
      absl::StrCat("no good checkpoint in '", dir, "'"));
}

}  // namespace bnps::checkpoint
