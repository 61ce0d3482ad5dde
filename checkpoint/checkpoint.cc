#include "checkpoint/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
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
#include "absl/strings/ascii.h"

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

// Extends `crc` (zlib's CRC-32) over `s`.
uLong CrcAdd(uLong crc, absl::string_view s) {
  // zlib takes uInt lengths: feed large payloads in pieces.
  size_t done = 0;
  while (done < s.size()) {
    const size_t n = std::min<size_t>(s.size() - done, size_t{1} << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(s.data() + done),
                static_cast<uInt>(n));
    done += n;
  }
  return crc;
}

uint32_t Crc(absl::string_view s) {
  return static_cast<uint32_t>(CrcAdd(crc32(0L, Z_NULL, 0), s));
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
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
    if (::mkdir(level.c_str(), 0700) != 0 && errno != EEXIST) {
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
  return WriteCheckpoint(dir, step, std::vector<absl::string_view>{payload}, keep);
}

absl::Status WriteCheckpoint(const std::string& dir, int64_t step,
                             const std::vector<absl::string_view>& pieces,
                             int keep) {
  if (dir.empty()) return absl::InvalidArgumentError("no checkpoint directory");
  if (step < 0) return absl::InvalidArgumentError("negative checkpoint step");
  if (absl::Status s = CreateCheckpointDir(dir); !s.ok()) return s;
  uint64_t length = 0;
  uLong crc = crc32(0L, Z_NULL, 0);
  for (absl::string_view p : pieces) {
    length += p.size();
    crc = CrcAdd(crc, p);
  }
  std::string header(kMagic, sizeof(kMagic));
  PutLe(&header, kFormatVersion, 4);
  PutLe(&header, static_cast<uint64_t>(step), 8);
  PutLe(&header, length, 8);
  PutLe(&header, static_cast<uint32_t>(crc), 4);

  const std::string path = CheckpointPath(dir, step);
  const std::string tmp = absl::StrCat(path, ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return Errno("cannot create", tmp);
  absl::Status s = WriteAll(fd, header, tmp);
  for (size_t i = 0; s.ok() && i < pieces.size(); ++i) {
    s = WriteAll(fd, pieces[i], tmp);
  }
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
  // Only a file that reads back whole may push the older ones out.
  if (absl::Status v = VerifyCheckpoint(path); !v.ok()) return v;

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

namespace {

struct Header {
  int64_t step = 0;
  uint64_t length = 0;
  uint32_t crc = 0;
};

absl::Status Bad(const std::string& path, const std::string& why) {
  return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", why));
}

// Checks the header's magic and version against `file_bytes`, the file's
// size.
absl::StatusOr<Header> ParseHeader(const std::string& path, const char* h,
                                   size_t file_bytes) {
  if (file_bytes < kHeaderBytes) {
    return Bad(path, absl::StrCat("torn: ", file_bytes,
                                  " bytes, shorter than the header"));
  }
  if (std::memcmp(h, kMagic, sizeof(kMagic)) != 0) {
    return Bad(path, "not a bnps checkpoint (bad magic)");
  }
  h += sizeof(kMagic);
  const uint32_t version = static_cast<uint32_t>(GetLe(h, 4));
  if (version != kFormatVersion) {
    return Bad(path, absl::StrCat("format version ", version,
                                  ", this server reads ", kFormatVersion));
  }
  Header header;
  header.step = static_cast<int64_t>(GetLe(h + 4, 8));
  header.length = GetLe(h + 12, 8);
  header.crc = static_cast<uint32_t>(GetLe(h + 20, 4));
  if (file_bytes - kHeaderBytes != header.length) {
    return Bad(path, absl::StrCat("torn: payload of ", file_bytes - kHeaderBytes,
                                  " bytes, the header says ", header.length));
  }
  return header;
}

}  // namespace

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
  absl::StatusOr<Header> header = ParseHeader(path, data.data(), data.size());
  if (!header.ok()) return header.status();
  CheckpointFile file;
  file.step = header->step;
  file.payload = data.substr(kHeaderBytes);
  if (Crc(file.payload) != header->crc) return Bad(path, "checksum mismatch");
  file.path = path;
  return file;
}

absl::Status VerifyCheckpoint(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Errno("cannot open", path);
  std::string buf(1 << 20, '\0');
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t total = 0;
  char head[kHeaderBytes];
  size_t n;
  while ((n = std::fread(&buf[0], 1, buf.size(), f)) > 0) {
    size_t skip = 0;
    if (total < kHeaderBytes) {
      skip = std::min<size_t>(n, kHeaderBytes - total);
      std::memcpy(head + total, buf.data(), skip);
    }
    crc = CrcAdd(crc, absl::string_view(buf.data() + skip, n - skip));
    total += n;
  }
  const bool error = std::ferror(f);
  std::fclose(f);
  if (error) return Errno("cannot read", path);
  absl::StatusOr<Header> header = ParseHeader(path, head, total);
  if (!header.ok()) return header.status();
  if (static_cast<uint32_t>(crc) != header->crc) {
    return Bad(path, "checksum mismatch");
  }
  return absl::OkStatus();
}

DirLock::~DirLock() { ::close(fd_); }  // releases the flock

absl::StatusOr<std::unique_ptr<DirLock>> LockCheckpointDir(const std::string& dir) {
  if (absl::Status s = CreateCheckpointDir(dir); !s.ok()) return s;
  const std::string path = absl::StrCat(dir, "/LOCK");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot open", path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {0};
    const ssize_t got = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK) {
      errno = err;
      return Errno("cannot lock", path);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory '", dir, "' is in use by another server (pid ",
        got > 0 ? absl::StripAsciiWhitespace(holder) : "unknown",
        ", holding ", path, "): give each server a directory of its own, or "
        "stop the other one first"));
  }
  std::unique_ptr<DirLock> lock(new DirLock(fd));
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    return Errno("cannot write", path);
  }
  // Holding the lock, nobody else writes here: a temporary file is what a
  // writer killed mid-write left.
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> stale;
    while (const dirent* e = ::readdir(d)) {
      absl::string_view name = e->d_name;
      if (absl::StartsWith(name, kPrefix) && absl::EndsWith(name, ".tmp")) {
        stale.push_back(absl::StrCat(dir, "/", name));
      }
    }
    ::closedir(d);
    for (const std::string& f : stale) ::unlink(f.c_str());
  }
  return lock;
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
