// Whole-buffer writes on a non-blocking TCP socket, waiting for room with
// poll(2) until a deadline, the options a latency-bound connection wants,
// and a listening socket. For the raw-TCP BN connection (server/bn_socket_server.h,
// client/internal/bn_socket.h).
//
// Thread-safety: plain functions; callers serialize writes to one socket.

#ifndef BNPS_UTIL_SOCKET_IO_H_
#define BNPS_UTIL_SOCKET_IO_H_

#include <cstddef>
#include <string>

#include <netinet/in.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace bnps::util {

// `host` (an IPv4 address or a name of one) and `port` as a socket address.
// UNAVAILABLE if it does not resolve to an IPv4 address.
absl::StatusOr<sockaddr_in> ResolveIPv4(const std::string& host, int port);

// A listening TCP socket on `addr` (non-blocking, close-on-exec, with
// SO_REUSEADDR so that a restarted server may rebind a port whose old
// connections linger in TIME_WAIT; a second live listener is still refused).
struct Listener {
  int fd;    // the caller's to close
  int port;  // addr's port, or the kernel's pick where that was 0
};
// UNAVAILABLE naming the address and the reason if it cannot listen.
absl::StatusOr<Listener> ListenTcp(const sockaddr_in& addr, int backlog);

// Writes all `n` bytes of `data` to the non-blocking socket `fd`.
// DEADLINE_EXCEEDED if the peer has not made room by `deadline`;
// UNAVAILABLE if the connection failed (no SIGPIPE is raised).
absl::Status SendAll(int fd, const char* data, size_t n, absl::Time deadline);

// Waits for a non-blocking connect(2) that returned EINPROGRESS to end:
// OK once connected; UNAVAILABLE with the reason if it failed;
// DEADLINE_EXCEEDED at `deadline`.
absl::Status FinishConnect(int fd, absl::Time deadline);

// Waits until `fd` is readable or `deadline`: true if readable (or failed:
// the next read says how), false at the deadline. Microsecond precision.
bool WaitReadable(int fd, absl::Time deadline);

// Seconds a TCP connection set up by SetLowLatency may be silent before
// its peer is probed (then every second, 3 times; data unacknowledged as
// long fails it too): a vanished peer is found in about 8 s.
inline constexpr int kKeepAliveIdleSeconds = 5;

// O_NONBLOCK, TCP_NODELAY and keepalive (above) on `fd` (O_NONBLOCK alone
// on a Unix socket). UNAVAILABLE naming `what` if one cannot be set.
absl::Status SetLowLatency(int fd, const std::string& what);

}  // namespace bnps::util

#endif  // BNPS_UTIL_SOCKET_IO_H_
