#include "util/socket_io.h"

#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace bnps::util {
namespace {

// ppoll on one fd until `deadline`; the revents, 0 at the deadline.
int PollUntil(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const absl::Duration left =
        std::max(absl::ZeroDuration(), deadline - absl::Now());
    timespec ts = absl::ToTimespec(std::min(left, absl::Hours(24)));
    const int r = ppoll(&p, 1, deadline == absl::InfiniteFuture() ? nullptr : &ts,
                        nullptr);
    if (r > 0) return p.revents;
    if (r == 0) {
      if (absl::Now() >= deadline) return 0;
      continue;
    }
    if (errno != EINTR) return POLLERR;
  }
}

}  // namespace

absl::StatusOr<sockaddr_in> ResolveIPv4(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 ||
      found == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot resolve '", host, "' to an IPv4 address (IPv4 only)"));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

absl::StatusOr<Listener> ListenTcp(const sockaddr_in& addr, int backlog) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
  const std::string where = absl::StrCat(ip, ":", ntohs(addr.sin_port));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in bound = addr;
  socklen_t len = sizeof bound;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(fd, backlog) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", where, ": ", strerror(err)));
  }
  return Listener{fd, ntohs(bound.sin_port)};
}

absl::Status SendAll(int fd, const char* data, size_t n, absl::Time deadline) {
  while (n > 0) {
    const ssize_t k = send(fd, data, n, MSG_NOSIGNAL);
    if (k > 0) {
      data += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (PollUntil(fd, POLLOUT, deadline) == 0) {
        return absl::DeadlineExceededError(
            "the peer did not read in time (a write was blocked)");
      }
      continue;
    }
    return absl::UnavailableError(
        absl::StrCat("the connection failed: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status FinishConnect(int fd, absl::Time deadline) {
  if (PollUntil(fd, POLLOUT, deadline) == 0) {
    return absl::DeadlineExceededError("connect: no answer before the deadline");
  }
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) {
    return absl::UnavailableError(absl::StrCat("connect: ", strerror(err)));
  }
  return absl::OkStatus();
}

bool WaitReadable(int fd, absl::Time deadline) {
  return PollUntil(fd, POLLIN, deadline) != 0;
}

absl::Status SetLowLatency(int fd, const std::string& what) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::UnavailableError(
        absl::StrCat(what, ": O_NONBLOCK: ", strerror(errno)));
  }
  int domain = AF_INET;
  socklen_t len = sizeof domain;
  getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len);
  if (domain == AF_UNIX) return absl::OkStatus();  // no Nagle to turn off
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    return absl::UnavailableError(
        absl::StrCat(what, ": TCP_NODELAY: ", strerror(errno)));
  }
  // A peer that vanished (a lost node, a half-open connection) is found
  // within about 8 s, under the servers' heartbeat timeout, so what it held
  // (a worker's BN claim) frees itself.
  const int idle_s = kKeepAliveIdleSeconds, interval_s = 1, probes = 3;
  const unsigned user_timeout_ms = 1000u * (idle_s + interval_s * probes);
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms,
                 sizeof user_timeout_ms) != 0) {
    return absl::UnavailableError(
        absl::StrCat(what, ": TCP keepalive: ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace bnps::util
