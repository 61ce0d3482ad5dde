// BnSocketServer's connection (server/bn_socket_server.h), shared by the
// files that implement the server: the listener's (bn_socket_server.cc) and
// the hello's (bn_socket_hello.cc). Internal to the server.

#ifndef BNPS_SERVER_BN_SOCKET_CONN_H_
#define BNPS_SERVER_BN_SOCKET_CONN_H_

#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/bn_frame.h"
#include "proto/bnps.pb.h"
#include "security/bn_handshake.h"
#include "server/bn_batch_dispatch.h"
#include "server/bn_dispatch.h"
#include "server/bn_socket_server.h"
#include "util/byte_budget.h"

namespace bnps::server {

// What the epoll thread waits for on a connection's reading side.
inline constexpr uint32_t kBnConnEvents = EPOLLIN | EPOLLRDHUP;

// One client connection. The epoll thread owns the reading side; answers
// are queued under write_mu by whichever thread has them, written at once
// as far as the socket takes them, and the rest flushed by the epoll thread
// (EPOLLOUT). The descriptor is closed when the last reference goes (an
// answer still owed holds one), so its number is never reused while anyone
// may write to it.
struct BnSocketServer::Conn {
  Conn(int fd, int epoll_fd, int64_t max_queued,
       std::shared_ptr<util::ByteBudget> budget)
      : fd(fd), epoll_fd(epoll_fd), max_queued(max_queued),
        budget(std::move(budget)), opened(absl::Now()) {}
  ~Conn() { close(fd); }

  void Write(const std::string& frame) {
    absl::MutexLock lock(&write_mu);
    if (shut) return;
    size_t sent = 0;
    if (out.empty()) {
      const ssize_t k = send(fd, frame.data(), frame.size(),
                             MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        ShutLocked();
        return;
      }
      sent = k > 0 ? static_cast<size_t>(k) : 0;
      if (sent == frame.size()) return;
    }
    // Answers the client has not read yet: held within its cap and the
    // server's budget, or the connection is cut off.
    const int64_t rest = static_cast<int64_t>(frame.size() - sent);
    const int64_t queued = static_cast<int64_t>(out.size()) + rest;
    if (queued > max_queued || !budget->TryCharge(rest)) {
      std::fprintf(stderr,
                   "bnps_server: a BN connection left %lld bytes of answers "
                   "unread (%s): cut off\n",
                   static_cast<long long>(queued),
                   queued > max_queued ? "over its cap"
                                       : "the server's BN memory budget is "
                                         "spent");
      ShutLocked();
      return;
    }
    // The queue was empty: the epoll thread is not watching for room yet.
    const bool watch = out.empty();
    out.append(frame, sent, std::string::npos);
    if (watch) {
      epoll_event ev{};
      ev.events = kBnConnEvents | EPOLLOUT;
      ev.data.fd = fd;
      epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &ev);
    }
  }

  // Whether an answer of `bytes` could be held (BnDispatcher::Admit): not
  // if it alone passes the connection's cap or what is left of the
  // server's budget. (A reader that falls behind is cut off by Write.)
  absl::Status Admit(int64_t bytes) const {
    return CheckAnswerFits(bytes, max_queued, *budget);
  }

  // On EPOLLOUT: writes what the socket takes; false if the connection
  // failed.
  bool Flush() {
    absl::MutexLock lock(&write_mu);
    if (shut) return false;
    while (!out.empty()) {
      const ssize_t k =
          send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        out.erase(0, static_cast<size_t>(k));
        budget->Release(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      ShutLocked();
      return false;
    }
    epoll_event ev{};  // all written: stop watching for room
    ev.events = kBnConnEvents;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &ev);
    return true;
  }

  void ShutLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu) {
    shut = true;
    budget->Release(static_cast<int64_t>(out.size()));
    out.clear();
    out.shrink_to_fit();
    shutdown(fd, SHUT_RDWR);  // the epoll thread sees the end
  }
  void Shut() {
    absl::MutexLock lock(&write_mu);
    ShutLocked();
  }

  const int fd;
  const int epoll_fd;
  const int64_t max_queued;
  const std::shared_ptr<util::ByteBudget> budget;
  const absl::Time opened;
  absl::Mutex write_mu;
  bool shut ABSL_GUARDED_BY(write_mu) = false;
  // Answers the socket has not taken; while not empty the epoll thread
  // watches for room (EPOLLOUT).
  std::string out ABSL_GUARDED_BY(write_mu);
  // The epoll thread's alone:
  proto::FrameReader reader;
  int64_t charged_in = 0;  // reader.buffered(), charged to the budget
  // When the frame now partly read began (InfiniteFuture: none is).
  absl::Time frame_started = absl::InfiniteFuture();
  // "tcp" or "unix", which the hello's handshake binds. Set at accept.
  std::string transport = "tcp";
  // Before the hello: the peer it counts against (its address, or the
  // Unix peer's uid) and its place in the order of arrival.
  bool pending = true;
  std::string peer;
  uint64_t serial = 0;
  // The budget charged_in is charged to: the one of connections before
  // their hello, then the server's.
  util::ByteBudget* in_budget = nullptr;
  bool released = false;  // Release ran
  // Between the hello and the client's proof (a job with a token).
  std::optional<security::HelloServer> handshake;
  proto::BnHello hello;
  std::optional<BnBatchDispatcher> dispatcher;  // after a good BnHello
  Admission admission;  // after a good BnHello: holds its worker's claim
  proto::BnRequest request;                // reused for every frame
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_BN_SOCKET_CONN_H_
