// Unix stream sockets by path, for the BN connection between processes of
// one host (server/bn_socket_server.h, client/internal/bn_socket.h): a
// listener that treats the path with care and a non-blocking connect.
//
// A listener's path: one that does not exist is made; a socket nobody
// listens on (a stale one a killed server left) is replaced; anything else
// (a file, a directory, a socket with a live listener) is refused. The
// socket's mode is 0600, so only the server's user may connect (the job
// token is still checked in the hello). RemoveUnixListener unlinks it.
//
// Thread-safety: plain functions.

#ifndef BNPS_UTIL_UNIX_SOCKET_H_
#define BNPS_UTIL_UNIX_SOCKET_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace bnps::util {

// The longest path a Unix socket address holds (sun_path less its NUL).
size_t MaxUnixPathBytes();

// `<dir>/bnps-bn-<random>/<pid>-<port>.sock`, where <dir> is
// $XDG_RUNTIME_DIR if it names a directory, else /tmp, and the directory
// bnps-bn-<random> is made here, private (0700, this user's), with a name
// nobody can guess: no other user can bind the path first or connect to it.
// The caller removes the directory (RemovePrivateSocketDir) with the socket.
// UNAVAILABLE if the directory cannot be made.
absl::StatusOr<std::string> MakePrivateSocketPath(int port);
// Removes the private directory MakePrivateSocketPath made for `path` (once
// the socket in it is gone); nothing if it holds anything else.
void RemovePrivateSocketDir(const std::string& path);

// A listening, non-blocking, close-on-exec Unix stream socket at `path`
// (the caller's to close, and to remove with RemoveUnixListener).
struct UnixListener {
  int fd = -1;
  // The socket file's identity, so that only this listener's file is
  // removed.
  uint64_t device = 0;
  uint64_t inode = 0;
};
// INVALID_ARGUMENT for an empty path or one longer than MaxUnixPathBytes
// (naming the limit); ALREADY_EXISTS if `path` is something other than a
// stale socket, or a server listens on it; UNAVAILABLE if it cannot be
// made.
absl::StatusOr<UnixListener> ListenUnix(const std::string& path, int backlog);

// Unlinks `path` if it is still `listener`'s socket file (not one a later
// server put in its place).
void RemoveUnixListener(const UnixListener& listener, const std::string& path);

// A non-blocking, close-on-exec connection to the listener at `path`,
// waiting until `deadline`. INVALID_ARGUMENT for a path that cannot be a
// socket address; UNAVAILABLE with the reason (no such file, connection
// refused, permission denied, ...) otherwise.
absl::StatusOr<int> ConnectUnix(const std::string& path, absl::Time deadline);

}  // namespace bnps::util

#endif  // BNPS_UTIL_UNIX_SOCKET_H_
