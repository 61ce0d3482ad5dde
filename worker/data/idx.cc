#include "worker/data/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace bnps::worker {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

// gzread takes an unsigned length; read in chunks of this many bytes.
constexpr size_t kReadChunk = size_t{1} << 20;
// The most a loader reserves ahead of the data (it grows from there as data
// arrives), whatever the header claims.
constexpr size_t kMaxReserve = size_t{16} << 20;

constexpr char kInstallHint[] =
    "Fashion-MNIST comes from Debian's dataset-fashion-mnist package "
    "(tools/setup.sh installs it into /usr/share/datasets/fashion-mnist)";

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// One open IDX file.
struct IdxFile {
  std::string path;
  GzFile file;
  int64_t disk_size = 0;  // bytes on disk (compressed, if it is gzip)
};

absl::Status OpenIdx(const std::string& path, IdxFile* out) {
  out->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat(path, ": no such file. ", kInstallHint));
    }
    return absl::Status(
        absl::ErrnoToStatusCode(error),
        absl::StrCat(path, ": cannot open: ", std::strerror(error)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::Status(
        absl::ErrnoToStatusCode(error),
        absl::StrCat(path, ": cannot stat: ", std::strerror(error)));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": is a directory, not an IDX file"));
  }
  out->disk_size = static_cast<int64_t>(st.st_size);
  gzFile f = gzdopen(fd, "rb");
  if (f == nullptr) {
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": cannot allocate a zlib reader"));
  }
  out->file.reset(f);
  gzbuffer(f, 1 << 17);
  return absl::OkStatus();
}

absl::Status ReadError(const IdxFile& f) {
  int error = Z_OK;
  const char* message = gzerror(f.file.get(), &error);
  if (error == Z_ERRNO) {
    return absl::DataLossError(
        absl::StrCat(f.path, ": read error: ", std::strerror(errno)));
  }
  absl::string_view text = message ? message : "unknown error";
  // zlib prefixes the "file name" it was given, "<fd:3>" after gzdopen.
  if (absl::StartsWith(text, "<fd:")) {
    const size_t colon = text.find(": ");
    if (colon != absl::string_view::npos) text.remove_prefix(colon + 2);
  }
  return absl::DataLossError(
      absl::StrCat(f.path, ": corrupt gzip data: ", text));
}

// Reads up to `n` bytes into `buf`; returns how many were read (fewer only at
// the end of the data).
absl::StatusOr<size_t> Read(const IdxFile& f, uint8_t* buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    const unsigned want = static_cast<unsigned>(std::min(n - done, kReadChunk));
    const int got = gzread(f.file.get(), buf + done, want);
    if (got < 0) return ReadError(f);
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

absl::Status CheckMagic(const IdxFile& f, uint32_t magic, uint32_t want) {
  if (magic == want) return absl::OkStatus();
  const char* kind = want == kImagesMagic ? "images" : "labels";
  std::string found;
  if (magic == kImagesMagic) found = " (an IDX images file)";
  if (magic == kLabelsMagic) found = " (an IDX labels file)";
  return absl::DataLossError(absl::StrFormat(
      "%s: bad magic 0x%08x%s; an IDX %s file starts with 0x%08x", f.path,
      magic, found, kind, want));
}

// Reads `count` big-endian uint32 header fields; `done` fields came before.
absl::Status ReadHeader(const IdxFile& f, int done, int count,
                        uint32_t* fields) {
  uint8_t bytes[16];
  absl::StatusOr<size_t> got = Read(f, bytes, 4 * count);
  if (!got.ok()) return got.status();
  if (*got < static_cast<size_t>(4 * count)) {
    return absl::DataLossError(absl::StrCat(f.path, ": truncated IDX header (",
                                            4 * done + *got, " of ",
                                            4 * (done + count), " bytes)"));
  }
  for (int i = 0; i < count; ++i) {
    fields[i] = (uint32_t{bytes[4 * i]} << 24) |
                (uint32_t{bytes[4 * i + 1]} << 16) |
                (uint32_t{bytes[4 * i + 2]} << 8) | uint32_t{bytes[4 * i + 3]};
  }
  return absl::OkStatus();
}

// Reads the magic, checks it, then reads the other `count - 1` fields.
absl::Status ReadHeaderWithMagic(const IdxFile& f, uint32_t magic, int count,
                                 uint32_t* fields) {
  if (absl::Status s = ReadHeader(f, 0, 1, fields); !s.ok()) return s;
  if (absl::Status s = CheckMagic(f, fields[0], magic); !s.ok()) return s;
  return ReadHeader(f, 1, count - 1, fields + 1);
}

// Reads exactly `n` bytes of data into `*out` and checks that nothing follows
// them. `what` describes the data for messages ("60000 images of 28x28").
absl::Status ReadBody(const IdxFile& f, size_t header_bytes, uint64_t n,
                      const std::string& what, std::vector<uint8_t>* out) {
  // A plain file's length is known before anything is read.
  if (gzdirect(f.file.get()) &&
      static_cast<uint64_t>(f.disk_size) != header_bytes + n) {
    const uint64_t have = static_cast<uint64_t>(f.disk_size) - header_bytes;
    return absl::DataLossError(
        absl::StrCat(f.path, ": ", have < n ? "truncated" : "trailing bytes",
                     ": header says ", what, " (", n,
                     " bytes of data) but the file has ", have));
  }
  out->clear();
  out->reserve(static_cast<size_t>(std::min<uint64_t>(n, kMaxReserve)));
  // Grow with the data actually read, never to what the header claims.
  while (out->size() < n) {
    const size_t old = out->size();
    const size_t want =
        static_cast<size_t>(std::min<uint64_t>(n - old, kReadChunk));
    out->resize(old + want);
    absl::StatusOr<size_t> got = Read(f, out->data() + old, want);
    if (!got.ok()) return got.status();
    out->resize(old + *got);
    if (*got < want) break;
  }
  int error = Z_OK;
  gzerror(f.file.get(), &error);
  if (out->size() < n) {
    return absl::DataLossError(absl::StrCat(
        f.path, ": truncated: header says ", what, " (", n,
        " bytes of data) but the file has only ", out->size(),
        error == Z_BUF_ERROR ? " (the gzip stream ends early)" : ""));
  }
  uint8_t extra[64];
  absl::StatusOr<size_t> got = Read(f, extra, sizeof(extra));
  if (!got.ok()) return got.status();
  if (*got > 0) {
    return absl::DataLossError(absl::StrCat(
        f.path, ": trailing bytes after the ", what, " the header declares"));
  }
  gzerror(f.file.get(), &error);
  if (error != Z_OK) return ReadError(f);  // e.g. a truncated gzip trailer
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> LoadIdx(const std::string& images_path,
                                const std::string& labels_path,
                                int num_classes) {
  if (num_classes < 1 || num_classes > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LoadIdx: num_classes is ", num_classes, "; need 1 to 256"));
  }
  IdxFile images;
  IdxFile labels;
  if (absl::Status s = OpenIdx(images_path, &images); !s.ok()) return s;
  if (absl::Status s = OpenIdx(labels_path, &labels); !s.ok()) return s;

  uint32_t ih[4];  // magic, count, rows, cols
  if (absl::Status s = ReadHeaderWithMagic(images, kImagesMagic, 4, ih);
      !s.ok()) {
    return s;
  }
  const int64_t count = ih[1];
  const int64_t rows = ih[2];
  const int64_t cols = ih[3];
  if (rows < 1 || cols < 1 || rows * cols > kMaxIdxImageSize) {
    return absl::DataLossError(
        absl::StrCat(images_path, ": header says images of ", rows, "x", cols,
                     "; need 1 to ", kMaxIdxImageSize, " pixels"));
  }
  if (count > kMaxIdxCount || count * rows * cols > kMaxIdxPixelBytes) {
    return absl::DataLossError(
        absl::StrCat(images_path, ": header says ", count, " images of ", rows,
                     "x", cols, ", over the limit of ", kMaxIdxCount,
                     " images and ", kMaxIdxPixelBytes, " bytes of pixels"));
  }

  uint32_t lh[2];  // magic, count
  if (absl::Status s = ReadHeaderWithMagic(labels, kLabelsMagic, 2, lh);
      !s.ok()) {
    return s;
  }
  if (lh[1] != count) {
    return absl::DataLossError(absl::StrCat(images_path, " has ", count,
                                            " images but ", labels_path,
                                            " has ", lh[1], " labels"));
  }

  Dataset d;
  d.rows = rows;
  d.cols = cols;
  d.num_classes = num_classes;
  if (absl::Status s = ReadBody(labels, 8, static_cast<uint64_t>(count),
                                absl::StrCat(count, " labels"), &d.labels);
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < d.labels.size(); ++i) {
    if (d.labels[i] >= num_classes) {
      return absl::DataLossError(absl::StrCat(
          labels_path, ": label ", static_cast<int>(d.labels[i]),
          " of example ", i, " is outside [0, ", num_classes, ")"));
    }
  }
  if (absl::Status s = ReadBody(
          images, 16, static_cast<uint64_t>(count * rows * cols),
          absl::StrCat(count, " images of ", rows, "x", cols), &d.pixels);
      !s.ok()) {
    return s;
  }
  return d;
}

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  auto path = [&](const char* kind) {
    std::string base = absl::StrCat(dir, "/", prefix, "-", kind, "-ubyte");
    struct stat st;
    const std::string gz = absl::StrCat(base, ".gz");
    if (::stat(gz.c_str(), &st) != 0 && ::stat(base.c_str(), &st) == 0) {
      return base;
    }
    return gz;  // the message of a missing file names the .gz
  };
  return LoadIdx(path("images-idx3"), path("labels-idx1"), /*num_classes=*/10);
}

}  // namespace bnps::worker
