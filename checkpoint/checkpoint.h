// Checkpoint files of one shard server: a directory of files
// "ckpt-<step, 12 digits>.bnps", each a fixed header and a payload (the
// serialized proto::ShardCheckpoint, which this library does not look into).
//
// Header (little-endian): magic "BNPSCKPT" (8 bytes), format version (u32),
// step (i64), payload length (u64), CRC-32 of the payload (zlib's, u32).
//
// Write is atomic on POSIX file systems: the file is written under a temporary
// name, fsynced, renamed into place, and the directory fsynced, so a crash
// leaves either the old set of files or the new one, never a torn file under a
// final name. Read checks the magic, the version, the length and the
// checksum, so a file torn or corrupted anyway (another writer, a disk) is
// detected: DATA_LOSS naming the file and what is wrong. LoadNewest falls back
// to the previous good file and logs one line per bad file it skipped.
//
// Errors: INVALID_ARGUMENT for an empty directory name or a negative step;
// INTERNAL (with errno's text) for failed file operations; NOT_FOUND when no
// (good) checkpoint exists.
//
// Write reads the new file back (its length and checksum, streamed) before
// it prunes older files, so a file the disk did not keep never replaces good
// ones. Files are created 0600 and directories 0700: a checkpoint holds the
// job's whole state.
//
// One writer per directory: LockCheckpointDir takes an exclusive flock on
// "<dir>/LOCK" for as long as the returned lock lives; a second server on the
// same directory (a terminating pod and its replacement on one volume) gets
// FAILED_PRECONDITION instead of pruning the first one's files.
//
// Thread-safety: the functions are thread-safe; two writers of one directory
// must not write the same step at once.

#ifndef BNPS_CHECKPOINT_CHECKPOINT_H_
#define BNPS_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bnps::checkpoint {

inline constexpr int kKeepCheckpoints = 3;  // files kept by Write

struct CheckpointFile {
  int64_t step = 0;
  std::string path;
  std::string payload;
};

// Creates `dir` and its missing parents (as mkdir -p); INTERNAL if that
// fails or the directory cannot be written.
absl::Status CreateCheckpointDir(const std::string& dir);

// The path of step `step`'s file in `dir`.
std::string CheckpointPath(const std::string& dir, int64_t step);

// Writes `payload` as step `step` (replacing one of the same step), creating
// `dir` (and its parents) if needed, reads it back, then removes all but the
// newest `keep` files. DATA_LOSS if the file read back is not what was
// written (older files are then kept).
absl::Status WriteCheckpoint(const std::string& dir, int64_t step,
                             const std::string& payload,
                             int keep = kKeepCheckpoints);

// As above, the payload being the concatenation of `pieces` (which stay
// owned by the caller), so that a large state is written without a copy
// that holds all of it.
absl::Status WriteCheckpoint(const std::string& dir, int64_t step,
                             const std::vector<absl::string_view>& pieces,
                             int keep = kKeepCheckpoints);

// Checks the file at `path` as ReadCheckpoint does (magic, version, length,
// checksum) without holding it in memory. DATA_LOSS for a torn or corrupt
// file.
absl::Status VerifyCheckpoint(const std::string& path);

// The exclusive writer's lock on a checkpoint directory (see above); the
// lock is released when this is destroyed.
class DirLock {
 public:
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();

 private:
  friend absl::StatusOr<std::unique_ptr<DirLock>> LockCheckpointDir(
      const std::string& dir);
  explicit DirLock(int fd) : fd_(fd) {}
  const int fd_;
};

// Creates `dir` if needed, locks it for this process (FAILED_PRECONDITION
// naming the directory and the holder's pid if another process holds it),
// and removes the temporary files ("*.tmp") a writer killed mid-write left.
absl::StatusOr<std::unique_ptr<DirLock>> LockCheckpointDir(const std::string& dir);

// The steps of the files in `dir`, newest first (by name; not verified).
// An absent directory has none.
absl::StatusOr<std::vector<int64_t>> ListCheckpoints(const std::string& dir);

// Reads and verifies one file. DATA_LOSS for a torn or corrupt file.
absl::StatusOr<CheckpointFile> ReadCheckpoint(const std::string& path);

// Renames a bad file to "<path>.bad", so that it is no longer listed (and
// stays for a post-mortem); returns the new name, or why not.
std::string SetAside(const std::string& path);

// The newest file of `dir` that verifies; each bad one (DATA_LOSS) is set
// aside and skipped with a line on stderr naming it ("<log_prefix>:
// checkpoint <path> is bad (...); set aside as <path>.bad; trying the
// previous one"). NOT_FOUND if none verifies; another error of reading
// (INTERNAL) as it is.
absl::StatusOr<CheckpointFile> LoadNewestCheckpoint(
    const std::string& dir, const std::string& log_prefix = "bnps");

}  // namespace bnps::checkpoint

#endif  // BNPS_CHECKPOINT_CHECKPOINT_H_
