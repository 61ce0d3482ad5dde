#include "server/bn_socket_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/bn_frame.h"
#include "proto/bnps.pb.h"
#include "security/job_token.h"
#include "server/bn_dispatch.h"
#include "server/rpc_util.h"
#include "util/socket_io.h"

namespace bnps::server {
namespace {

using M = ServerMetrics;

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(errno)));
}

}  // namespace

// One client connection. The epoll thread owns the reading side; answers
// are written under write_mu by whichever thread has them. The descriptor
// is closed when the last reference goes (an answer still owed holds one),
// so its number is never reused while anyone may write to it.
struct BnSocketServer::Conn {
  explicit Conn(int fd) : fd(fd) {}
  ~Conn() { close(fd); }

  // Writes one frame, or nothing once the connection is shut.
  void Write(const std::string& frame, absl::Duration timeout) {
    absl::MutexLock lock(&write_mu);
    if (shut) return;
    if (!util::SendAll(fd, frame.data(), frame.size(), absl::Now() + timeout)
             .ok()) {
      shut = true;
      shutdown(fd, SHUT_RDWR);  // the epoll thread sees the end
    }
  }

  void Shut() {
    absl::MutexLock lock(&write_mu);
    shut = true;
    shutdown(fd, SHUT_RDWR);
  }

  const int fd;
  absl::Mutex write_mu;
  bool shut ABSL_GUARDED_BY(write_mu) = false;
  // The epoll thread's alone:
  proto::FrameReader reader;
  std::optional<BnDispatcher> dispatcher;  // after a good BnHello
  proto::BnRequest request;                // reused for every frame
};

absl::StatusOr<std::unique_ptr<BnSocketServer>> BnSocketServer::Start(
    Shard* shard, ServerMetrics* metrics, util::KeepAwake* keep_awake,
    Options options) {
  std::unique_ptr<BnSocketServer> s(
      new BnSocketServer(shard, metrics, keep_awake, std::move(options)));
  const std::string where =
      absl::StrCat(s->options_.host, ":", s->options_.port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(s->options_.host.c_str(), nullptr, &hints, &found) != 0 ||
      found == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "BN listener: cannot resolve '", s->options_.host,
        "' to an IPv4 address"));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  addr.sin_port = htons(static_cast<uint16_t>(s->options_.port));
  s->listen_fd_ =
      socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return Errno("BN listener: socket");
  if (bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) !=
          0 ||
      listen(s->listen_fd_, 256) != 0) {
    return Errno(absl::StrCat("BN listener: cannot listen on ", where));
  }
  socklen_t len = sizeof addr;
  if (getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) !=
      0) {
    return Errno("BN listener: getsockname");
  }
  s->port_ = ntohs(addr.sin_port);
  s->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  s->stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->epoll_fd_ < 0 || s->stop_fd_ < 0) return Errno("BN listener: epoll");
  for (int fd : {s->listen_fd_, s->stop_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(s->epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return Errno("BN listener: epoll_ctl");
    }
  }
  s->thread_ = std::thread([p = s.get()] { p->Run(); });
  return s;
}

BnSocketServer::~BnSocketServer() {
  Stop();
  for (int fd : {listen_fd_, epoll_fd_, stop_fd_}) {
    if (fd >= 0) close(fd);
  }
}

void BnSocketServer::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof one);
  thread_.join();
}

void BnSocketServer::Run() {
  std::map<int, std::shared_ptr<Conn>> conns;
  auto drop = [&](int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    it->second->Shut();
    conns.erase(it);  // closed once no answer holds it
  };
  epoll_event events[64];
  char buf[64 * 1024];
  for (;;) {
    const int n = epoll_wait(epoll_fd_, events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int e = 0; e < n; ++e) {
      const int fd = events[e].data.fd;
      if (fd == stop_fd_) {
        for (auto& [c, conn] : conns) conn->Shut();
        return;
      }
      if (fd == listen_fd_) {
        for (;;) {
          const int c = accept4(listen_fd_, nullptr, nullptr,
                                SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;
          auto conn = std::make_shared<Conn>(c);
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.fd = c;
          if (!util::SetLowLatency(c, "BN connection").ok() ||
              epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c, &ev) != 0) {
            continue;  // conn closes the descriptor
          }
          conns.emplace(c, std::move(conn));
          accepted_.fetch_add(1);
        }
        continue;
      }
      auto it = conns.find(fd);
      if (it == conns.end()) continue;
      std::shared_ptr<Conn> conn = it->second;
      bool open = true;
      for (;;) {
        const ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k > 0) {
          conn->reader.Append(buf, static_cast<size_t>(k));
          if (static_cast<size_t>(k) < sizeof buf) break;
          continue;
        }
        if (k < 0 && errno == EINTR) continue;
        open = k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
        break;
      }
      // Frames that came before the end are still answered.
      if (!HandleFrames(conn) || !open) drop(fd);
    }
  }
}

bool BnSocketServer::HandleFrames(const std::shared_ptr<Conn>& conn) {
  for (;;) {
    absl::StatusOr<std::optional<absl::string_view>> frame = conn->reader.Next();
    if (!frame.ok()) {
      LogRejected(*shard_, "BnSync (TCP)", -1, frame.status());
      return false;
    }
    if (!frame->has_value()) return true;
    const absl::string_view bytes = **frame;
    if (keep_awake_ != nullptr) keep_awake_->Touch();
    if (!conn->dispatcher.has_value()) {
      if (!HandleHello(*conn, bytes)) return false;
      continue;
    }
    if (metrics_) metrics_->Received(M::kBnSync, bytes.size() + 4);
    proto::BnRequest& req = conn->request;
    if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      LogRejected(*shard_, "BnSync (TCP)", -1,
                  absl::InvalidArgumentError("bytes that are no BnRequest"));
      return false;
    }
    ServerMetrics* metrics = metrics_;
    const absl::Duration timeout = options_.write_timeout;
    conn->dispatcher->Dispatch(
        req, [conn, metrics, timeout](const proto::BnResponse& resp) {
          std::string out;
          if (!proto::AppendFrame(resp, &out).ok()) {
            conn->Shut();  // an answer over the limit: cannot be framed
            return;
          }
          if (metrics) metrics->Sent(M::kBnSync, out.size());
          conn->Write(out, timeout);
        });
  }
}

bool BnSocketServer::HandleHello(Conn& conn, absl::string_view bytes) {
  proto::BnHello hello;
  absl::Status s;
  if (!hello.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    s = absl::InvalidArgumentError("the first frame is no BnHello");
  }
  if (s.ok() && !options_.token.empty()) {
    s = security::CheckToken(options_.token, hello.token());
  }
  if (s.ok()) s = shard_->CheckCaller(hello.job(), hello.worker());
  proto::BnHelloReply reply;
  reply.set_code(static_cast<int>(s.code()));
  reply.set_message(std::string(s.message()));
  std::string out;
  if (proto::AppendFrame(reply, &out).ok()) {
    conn.Write(out, options_.write_timeout);
  }
  if (!s.ok()) {
    const bool known = s.code() != absl::StatusCode::kUnauthenticated;
    LogRejected(*shard_, "BnSync (TCP)", known ? hello.worker() : -1, s);
    return false;
  }
  conn.dispatcher.emplace(shard_, metrics_, hello.generation());
  return true;
}

}  // namespace bnps::server
