#include "util/unix_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "util/socket_io.h"

namespace bnps::util {
namespace {

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError("a Unix socket needs a path");
  }
  if (path.size() > MaxUnixPathBytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Unix socket path ", path, " has ", path.size(),
        " bytes; a Unix socket address holds at most ", MaxUnixPathBytes()));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// Whether a server listens at `addr` (a blocking probe: connect to a Unix
// socket answers at once).
bool Listening(const sockaddr_un& addr) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool live =
      connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 ||
      errno == EAGAIN;  // a full backlog: alive all the same
  close(fd);
  return live;
}

}  // namespace

size_t MaxUnixPathBytes() { return sizeof(sockaddr_un{}.sun_path) - 1; }

absl::StatusOr<std::string> MakePrivateSocketPath(int port) {
  std::string dir = "/tmp";
  const char* runtime = getenv("XDG_RUNTIME_DIR");
  struct stat st;
  if (runtime != nullptr && runtime[0] != '\0' && stat(runtime, &st) == 0 &&
      S_ISDIR(st.st_mode)) {
    dir = runtime;
  }
  std::string made = absl::StrCat(dir, "/bnps-bn-XXXXXX");
  if (mkdtemp(&made[0]) == nullptr) {  // 0700, a fresh random name
    return absl::UnavailableError(
        absl::StrCat("cannot make a private directory under ", dir, ": ",
                     strerror(errno)));
  }
  return absl::StrCat(made, "/", getpid(), "-", port, ".sock");
}

void RemovePrivateSocketDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return;
  const std::string dir = path.substr(0, slash);
  if (dir.find("/bnps-bn-") == std::string::npos) return;
  rmdir(dir.c_str());  // fails, harmlessly, if anything else is in it
}

absl::StatusOr<UnixListener> ListenUnix(const std::string& path, int backlog) {
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::AlreadyExistsError(absl::StrCat(
          path, " exists and is not a socket: not replaced"));
    }
    if (Listening(*addr)) {
      return absl::AlreadyExistsError(
          absl::StrCat("a server already listens on ", path));
    }
    unlink(path.c_str());  // stale: its server is gone
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  }
  // 0600 before it listens: nobody else connects in between.
  const int bound =
      bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr);
  if (bound != 0 || chmod(path.c_str(), 0600) != 0 ||
      listen(fd, backlog) != 0) {
    const int err = errno;
    if (bound == 0) unlink(path.c_str());
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", path, ": ", strerror(err)));
  }
  UnixListener listener;
  listener.fd = fd;
  if (lstat(path.c_str(), &st) == 0) {
    listener.device = st.st_dev;
    listener.inode = st.st_ino;
  }
  return listener;
}

void RemoveUnixListener(const UnixListener& listener,
                        const std::string& path) {
  struct stat there;
  if (listener.inode != 0 && lstat(path.c_str(), &there) == 0 &&
      S_ISSOCK(there.st_mode) && there.st_ino == listener.inode &&
      there.st_dev == listener.device) {
    unlink(path.c_str());
  }
}

absl::StatusOr<int> ConnectUnix(const std::string& path, absl::Time deadline) {
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  }
  if (connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) !=
      0) {
    absl::Status st;
    if (errno == EINPROGRESS) {
      st = FinishConnect(fd, deadline);
    } else if (errno == EAGAIN) {
      st = absl::UnavailableError("the server's backlog is full");
    } else {
      st = absl::UnavailableError(strerror(errno));
    }
    if (!st.ok()) {
      close(fd);
      return absl::UnavailableError(
          absl::StrCat("connect ", path, ": ", st.message()));
    }
  }
  return fd;
}

}  // namespace bnps::util
