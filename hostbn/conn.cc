#include "hostbn/conn.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "util/socket_io.h"

namespace bnps::hostbn {

Conn::Conn(int fd, absl::Duration timeout, size_t max_queued)
    : fd_(fd),
      wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      timeout_(timeout),
      max_queued_(max_queued) {
  // Without a wake-up the serving thread would not learn of queued frames.
  if (wake_fd_ < 0) shutdown(fd_, SHUT_RDWR);
}

Conn::~Conn() {
  close(fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void Conn::Wake() {
  const uint64_t one = 1;
  // A full counter (never, in practice) still wakes the poller.
  (void)!write(wake_fd_, &one, sizeof one);
}

void Conn::Send(const google::protobuf::MessageLite& m) {
  std::string frame;
  const bool encoded = proto::AppendFrame(m, &frame).ok();
  absl::MutexLock lock(&mu_);
  if (shut_) return;
  if (!encoded || queued_ + frame.size() > max_queued_) {
    ShutLocked();
    return;
  }
  if (out_.empty()) {
    progress_ = absl::Now();  // the write timeout runs from here
    Wake();
  }
  queued_ += frame.size();
  out_.push_back(std::move(frame));
}

void Conn::WriteNow(const google::protobuf::MessageLite& m) {
  std::string frame;
  if (!proto::AppendFrame(m, &frame).ok() ||
      !util::SendAll(fd_, frame.data(), frame.size(), absl::Now() + timeout_)
           .ok()) {
    Shut();
  }
}

void Conn::Shut() {
  absl::MutexLock lock(&mu_);
  ShutLocked();
}

void Conn::ShutLocked() {
  shut_ = true;
  out_.clear();
  written_ = 0;
  queued_ = 0;
  shutdown(fd_, SHUT_RDWR);  // wakes the serving thread's poll
}

void Conn::CloseWhenFlushed() {
  absl::MutexLock lock(&mu_);
  if (shut_ || close_when_flushed_) return;
  close_when_flushed_ = true;
  if (out_.empty()) {
    ShutLocked();
  } else {
    Wake();  // stop polling for reads
  }
}

size_t Conn::queued_bytes() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

void Conn::WriteSome() {
  while (!out_.empty()) {
    const std::string& f = out_.front();
    const ssize_t k = send(fd_, f.data() + written_, f.size() - written_,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      ShutLocked();  // the peer is gone
      return;
    }
    progress_ = absl::Now();
    written_ += static_cast<size_t>(k);
    queued_ -= static_cast<size_t>(k);
    if (written_ == f.size()) {
      out_.pop_front();
      written_ = 0;
    }
  }
  if (close_when_flushed_) ShutLocked();
}

bool Conn::Pump(absl::Time deadline) {
  for (;;) {
    bool want_write = false;
    bool want_read = true;
    absl::Time until = deadline;
    {
      absl::MutexLock lock(&mu_);
      if (shut_) return true;  // the read says it ended
      want_write = !out_.empty();
      want_read = !close_when_flushed_;
      if (want_write) {
        const absl::Time stalled = progress_ + timeout_;
        if (absl::Now() >= stalled) {
          ShutLocked();  // no byte taken for `timeout`
          return true;
        }
        until = std::min(until, stalled);
      }
    }
    pollfd fds[2] = {};
    fds[0].fd = fd_;
    fds[0].events = static_cast<short>((want_read ? POLLIN : 0) |
                                       (want_write ? POLLOUT : 0));
    fds[1].fd = wake_fd_;
    fds[1].events = POLLIN;
    int ms = -1;
    if (until != absl::InfiniteFuture()) {
      const absl::Duration left = until - absl::Now();
      ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
          0, 60 * 60 * 1000));
    }
    const int r = poll(fds, 2, ms);
    if (r < 0 && errno != EINTR) return true;  // the read says why
    if (r > 0 && (fds[1].revents & POLLIN) != 0) {
      uint64_t n = 0;
      (void)!read(wake_fd_, &n, sizeof n);
    }
    const short got = r > 0 ? fds[0].revents : 0;
    if ((got & (POLLOUT | POLLERR | POLLHUP)) != 0 && want_write) {
      absl::MutexLock lock(&mu_);
      WriteSome();
    }
    if (want_read && (got & (POLLIN | POLLERR | POLLHUP)) != 0) return true;
    if ((got & (POLLERR | POLLHUP | POLLNVAL)) != 0 && !want_read) {
      Shut();  // ended while it flushed
      return true;
    }
    if (deadline != absl::InfiniteFuture() && absl::Now() >= deadline) {
      return false;
    }
  }
}

absl::StatusOr<std::string> Conn::ReadFrame(absl::Time deadline,
                                            size_t max_bytes) {
  for (;;) {
    absl::StatusOr<std::optional<absl::string_view>> f = reader_.Next();
    if (!f.ok()) return f.status();
    if (f->has_value()) return std::string(**f);
    if (reader_.buffered() > max_bytes) {
      return absl::InvalidArgumentError("a frame too long");
    }
    if (!Pump(deadline)) {
      return absl::DeadlineExceededError("no whole frame in time");
    }
    {
      absl::MutexLock lock(&mu_);
      if (shut_) return absl::UnavailableError("the connection was shut");
    }
    char buf[16 * 1024];
    const ssize_t k = recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (k > 0) {
      reader_.Append(buf, static_cast<size_t>(k));
    } else if (k == 0) {
      return absl::UnavailableError("the connection closed");
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(
          absl::StrCat("read: ", strerror(errno)));
    }
  }
}

}  // namespace bnps::hostbn
