#include "client/internal/bn_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/codec.h"
#include "security/bn_handshake.h"
#include "util/socket_io.h"
#include "util/spin.h"
#include "util/unix_socket.h"

namespace bnps::client::internal {
namespace {

absl::Status Unavailable(const std::string& what) {
  return absl::UnavailableError(absl::StrCat("BN connection: ", what));
}

// Reads whatever is there (non-blocking) into `reader`: OK with or without
// bytes; UNAVAILABLE at the end of the connection or on an error.
absl::Status Drain(int fd, proto::FrameReader* reader, bool* got) {
  char buf[16 * 1024];
  for (;;) {
    const ssize_t k = recv(fd, buf, sizeof buf, 0);
    if (k > 0) {
      reader->Append(buf, static_cast<size_t>(k));
      *got = true;
      if (static_cast<size_t>(k) < sizeof buf) return absl::OkStatus();
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return absl::OkStatus();
    }
    return Unavailable(k == 0 ? "the server closed the connection"
                              : absl::StrCat("read: ", strerror(errno)));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<BnSocket>> BnSocket::Connect(
    const std::string& host, int port, const proto::BnHello& hello,
    const std::string& token, absl::Time deadline, absl::Duration spin) {
  absl::StatusOr<sockaddr_in> resolved = util::ResolveIPv4(host, port);
  if (!resolved.ok()) return Unavailable(std::string(resolved.status().message()));
  sockaddr_in addr = *resolved;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(absl::StrCat("socket: ", strerror(errno)));
  std::unique_ptr<BnSocket> s(new BnSocket(fd, hello.generation(), spin));
  if (absl::Status st = util::SetLowLatency(fd, "BN over TCP"); !st.ok()) {
    return st;
  }
  const std::string where = absl::StrCat(host, ":", port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno != EINPROGRESS) {
      return Unavailable(absl::StrCat("connect ", where, ": ", strerror(errno)));
    }
    if (absl::Status st = util::FinishConnect(fd, deadline); !st.ok()) {
      return Unavailable(absl::StrCat(where, ": ", st.message()));
    }
  }
  if (absl::Status st = s->Hello(where, hello, token, "tcp", deadline, nullptr);
      !st.ok()) {
    return st;
  }
  return s;
}

absl::StatusOr<std::unique_ptr<BnSocket>> BnSocket::ConnectUnix(
    const std::string& path, uint64_t server_incarnation,
    const proto::BnHello& hello, const std::string& token,
    absl::Time deadline, absl::Duration spin) {
  absl::StatusOr<int> fd = util::ConnectUnix(path, deadline);
  if (!fd.ok()) return absl::UnavailableError(fd.status().message());
  std::unique_ptr<BnSocket> s(new BnSocket(*fd, hello.generation(), spin));
  ucred peer{};
  socklen_t len = sizeof peer;
  if (getsockopt(*fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    return Unavailable(absl::StrCat(path, ": SO_PEERCRED: ", strerror(errno)));
  }
  if (peer.uid != geteuid() && peer.uid != 0) {
    return absl::UnavailableError(absl::StrCat(
        path, " is served by another user (uid ", peer.uid,
        "), not the shard's: nothing was sent to it"));
  }
  uint64_t answered = 0;
  if (absl::Status st = s->Hello(path, hello, token, "unix", deadline, &answered);
      !st.ok()) {
    return st;
  }
  if (answered != server_incarnation) {
    return absl::UnavailableError(absl::StrCat(
        path, " is another server's socket (a server on this host at the "
        "same path), not the shard's"));
  }
  return s;
}

absl::Status BnSocket::Hello(const std::string& where,
                             const proto::BnHello& hello,
                             const std::string& token,
                             const std::string& transport, absl::Time deadline,
                             uint64_t* server_incarnation) {
  const security::HelloClient client(hello, token, transport, where);
  auto send = [&](const google::protobuf::MessageLite& m) -> absl::Status {
    std::string frame;
    if (absl::Status st = proto::AppendFrame(m, &frame); !st.ok()) return st;
    if (absl::Status st = util::SendAll(fd_, frame.data(), frame.size(), deadline);
        !st.ok()) {
      return Unavailable(absl::StrCat("hello to ", where, ": ", st.message()));
    }
    return absl::OkStatus();
  };
  if (absl::Status st = send(client.hello()); !st.ok()) return st;
  proto::BnHelloReply reply;
  if (absl::Status st = ReadHelloFrame(where, deadline, &reply); !st.ok()) {
    return st;
  }
  absl::StatusOr<std::optional<proto::BnHelloProof>> proof =
      client.OnFirstReply(reply);
  if (!proof.ok()) return proof.status();
  if (proof->has_value()) {
    if (absl::Status st = send(**proof); !st.ok()) return st;
    if (absl::Status st = ReadHelloFrame(where, deadline, &reply); !st.ok()) {
      return st;
    }
    if (reply.challenge()) {
      return Unavailable(absl::StrCat(where, " sent a second challenge"));
    }
  }
  if (reply.code() != 0) return proto::StatusFromWire(reply.code(), reply.message());
  if (server_incarnation != nullptr) {
    *server_incarnation = reply.server_incarnation();
  }
  return absl::OkStatus();
}

absl::Status BnSocket::ReadHelloFrame(const std::string& where,
                                      absl::Time deadline,
                                      google::protobuf::MessageLite* m) {
  for (;;) {
    absl::StatusOr<std::optional<absl::string_view>> f = reader_.Next();
    if (!f.ok()) return Unavailable(std::string(f.status().message()));
    if (f->has_value()) {
      if (!m->ParseFromArray((*f)->data(), static_cast<int>((*f)->size()))) {
        return Unavailable(absl::StrCat(where, " answered no ", m->GetTypeName()));
      }
      return absl::OkStatus();
    }
    if (!util::WaitReadable(fd_, deadline)) {
      return Unavailable(absl::StrCat(where, " did not answer the hello"));
    }
    bool got = false;
    if (absl::Status st = Drain(fd_, &reader_, &got); !st.ok()) return st;
  }
}

BnSocket::~BnSocket() { close(fd_); }

bool BnSocket::broken() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

void BnSocket::Shut(absl::string_view why) {
  absl::MutexLock lock(&mu_);
  BreakLocked(Unavailable(std::string(why)));
}

void BnSocket::BreakLocked(const absl::Status& why) {
  if (!broken_) shutdown(fd_, SHUT_RDWR);  // a reader blocked in poll wakes
  broken_ = true;
  for (auto& [id, call] : pending_) {
    call->done = true;
    call->status = why;
    call->retry = true;
  }
  pending_.clear();
}

BnTransport::Outcome BnSocket::Call(const proto::BnRequest& request,
                                 absl::Time deadline) {
  std::string frame;
  if (absl::Status s = proto::AppendFrame(request, &frame); !s.ok()) {
    return {s, false, {}};
  }
  const uint64_t id = request.id();
  Pending call;
  {
    absl::MutexLock lock(&mu_);
    if (broken_) return {Unavailable("the connection broke"), true, {}};
    pending_[id] = &call;
  }
  absl::Status sent;
  {
    absl::MutexLock lock(&write_mu_);
    sent = util::SendAll(fd_, frame.data(), frame.size(), deadline);
  }
  absl::MutexLock lock(&mu_);
  if (!sent.ok()) {
    // Either way the connection cannot be trusted with the next frame: a
    // partial one may be in it.
    pending_.erase(id);
    BreakLocked(sent);
    if (sent.code() == absl::StatusCode::kDeadlineExceeded) {
      return {absl::DeadlineExceededError(
                  "no response before the deadline (a write was blocked)"),
              false, {}};
    }
    return {sent, true, {}};
  }
  auto done_or_free = [this, &call]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return call.done || !reading_;
  };
  while (!call.done) {
    if (reading_) {
      if (!mu_.AwaitWithDeadline(absl::Condition(&done_or_free), deadline) &&
          !call.done) {
        pending_.erase(id);
        return {absl::DeadlineExceededError("no response before the deadline"),
                false, {}};
      }
      continue;
    }
    reading_ = true;
    mu_.Unlock();
    const absl::Status read = ReadSome(deadline);
    mu_.Lock();
    reading_ = false;
    const absl::Status delivered = Deliver();
    if (!read.ok() || !delivered.ok()) {
      BreakLocked(!read.ok() ? read : delivered);
    } else if (!call.done && absl::Now() >= deadline) {
      pending_.erase(id);
      return {absl::DeadlineExceededError("no response before the deadline"),
              false, {}};
    }
  }
  return {std::move(call.status), call.retry, std::move(call.response)};
}

absl::Status BnSocket::ReadSome(absl::Time deadline) {
  bool got = false;
  if (spin_ > absl::ZeroDuration()) {
    const absl::Time spin_end = std::min(absl::Now() + spin_, deadline);
    unsigned looks = 0;
    do {
      if (absl::Status s = Drain(fd_, &reader_, &got); !s.ok()) return s;
      if (!got) util::PollPause(looks++);
    } while (!got && absl::Now() < spin_end);
  }
  while (!got) {
    if (!util::WaitReadable(fd_, deadline)) return absl::OkStatus();
    if (absl::Status s = Drain(fd_, &reader_, &got); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status BnSocket::Deliver() {
  for (;;) {
    absl::StatusOr<std::optional<absl::string_view>> f = reader_.Next();
    if (!f.ok()) return Unavailable(std::string(f.status().message()));
    if (!f->has_value()) return absl::OkStatus();
    proto::BnResponse response;
    if (!response.ParseFromArray((*f)->data(), static_cast<int>((*f)->size()))) {
      return Unavailable("the server sent bytes that are no BnResponse");
    }
    auto it = pending_.find(response.id());
    if (it == pending_.end()) continue;  // its caller gave up
    it->second->done = true;
    it->second->response = std::move(response);
    pending_.erase(it);
  }
}

}  // namespace bnps::client::internal
