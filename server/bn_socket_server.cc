#include "server/bn_socket_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/bn_frame.h"
#include "proto/bnps.pb.h"
#include "proto/limits.h"
#include "security/job_token.h"
#include "server/bn_batch_dispatch.h"
#include "server/bn_dispatch.h"
#include "server/bn_socket_conn.h"
#include "server/rpc_util.h"
#include "util/fd_limit.h"
#include "util/socket_io.h"
#include "util/spin.h"
#include "util/unix_socket.h"

namespace bnps::server {
namespace {

using M = ServerMetrics;

constexpr uint32_t kIn = kBnConnEvents;
constexpr size_t kReadChunk = 64 * 1024;
// Chunks read from one connection per readiness event, so that one fast
// sender cannot keep the thread from the others.
constexpr int kChunksPerEvent = 16;
// Connections accepted per readiness of the listener.
constexpr int kAcceptsPerEvent = 64;
// How long the listener rests when the process is out of descriptors.
constexpr absl::Duration kMinBackoff = absl::Milliseconds(10);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);

// Whom a connection before its hello counts against: its IPv4 address.
std::string PeerOfTcp(const sockaddr_storage& from, socklen_t len) {
  if (from.ss_family != AF_INET || len < sizeof(sockaddr_in)) return "?";
  char text[INET_ADDRSTRLEN] = {};
  const auto& in = reinterpret_cast<const sockaddr_in&>(from);
  inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
  return text;
}

// Over the Unix socket: the peer's uid.
std::string PeerOfUnix(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return "unix:?";
  }
  return absl::StrCat("unix:", cred.uid);
}

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BnSocketServer>> BnSocketServer::Start(
    Shard* shard, ServerMetrics* metrics, util::KeepAwake* keep_awake,
    Options options) {
  std::unique_ptr<BnSocketServer> s(
      new BnSocketServer(shard, metrics, keep_awake, std::move(options)));
  absl::StatusOr<sockaddr_in> addr =
      util::ResolveIPv4(s->options_.host, s->options_.port);
  absl::StatusOr<util::Listener> listener =
      addr.ok() ? util::ListenTcp(*addr, 256) : addr.status();
  if (!listener.ok()) {
    return absl::UnavailableError(
        absl::StrCat("BN over TCP: ", listener.status().message()));
  }
  s->listen_fd_ = listener->fd;
  if (!s->options_.unix_path.empty()) {
    s->unix_path_ = s->options_.unix_path;
    if (s->unix_path_ == "auto") {
      absl::StatusOr<std::string> path = util::MakePrivateSocketPath(listener->port);
      if (!path.ok()) {
        return absl::Status(path.status().code(),
                            absl::StrCat("BN over a Unix socket: ",
                                         path.status().message()));
      }
      s->unix_path_ = *path;
      s->unix_dir_made_ = true;
    }
    absl::StatusOr<util::UnixListener> u = util::ListenUnix(s->unix_path_, 256);
    if (!u.ok()) {
      return absl::Status(u.status().code(),
                          absl::StrCat("BN over a Unix socket: ",
                                       u.status().message()));
    }
    s->unix_listener_ = *u;
    s->unix_fd_ = u->fd;
  }
  s->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  s->stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  s->spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (s->epoll_fd_ < 0 || s->stop_fd_ < 0) return Errno("BN over TCP: epoll");
  for (int fd : {s->listen_fd_, s->stop_fd_, s->unix_fd_}) {
    if (fd < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(s->epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return Errno("BN over TCP: epoll_ctl");
    }
  }
  if (s->options_.max_connections > 0) {
    s->max_connections_ = s->options_.max_connections;
    s->max_unauthenticated_ =
        s->options_.max_unauthenticated > 0
            ? s->options_.max_unauthenticated
            : std::clamp(s->max_connections_ / 8, 16, 1024);
  } else {
    // Both out of the one cap, so that the descriptors stay within it.
    const int cap = ConnectionCap(util::OpenFileLimit());
    s->max_unauthenticated_ = s->options_.max_unauthenticated > 0
                                  ? s->options_.max_unauthenticated
                                  : std::clamp(cap / 8, 16, 1024);
    s->max_connections_ = std::max(cap - s->max_unauthenticated_, 1);
  }
  if (s->options_.max_unauthenticated_per_peer <= 0) {
    return absl::InvalidArgumentError(
        "BN over TCP: max_unauthenticated_per_peer <= 0");
  }
  if (s->options_.budget != nullptr) {
    s->budget_ = s->options_.budget;
  } else if (s->options_.memory_budget_bytes <= 0) {
    return absl::InvalidArgumentError("BN over TCP: a memory budget <= 0");
  } else {
    s->budget_ =
        std::make_shared<util::ByteBudget>(s->options_.memory_budget_bytes);
  }
  s->max_hello_bytes_ =
      MaxHelloBytes(shard->options().job, shard->options().num_workers);
  s->hello_budget_ = std::make_shared<util::ByteBudget>(
      s->options_.unauthenticated_budget_bytes > 0
          ? s->options_.unauthenticated_budget_bytes
          : static_cast<int64_t>(s->max_unauthenticated_) *
                static_cast<int64_t>(s->max_hello_bytes_ +
                                     proto::kFrameHeaderBytes));
  s->auth_ = std::make_unique<security::TokenAuthenticator>(
      s->options_.token, s->options_.per_worker_tokens,
      shard->options().num_workers);
  s->port_.store(listener->port);
  s->unix_listening_.store(s->unix_fd_ >= 0);
  s->thread_ = std::thread([p = s.get()] { p->Run(); });
  return s;
}

BnSocketServer::~BnSocketServer() {
  Stop();
  // Run closed the listeners if it ran.
  if (unix_fd_ >= 0) util::RemoveUnixListener(unix_listener_, unix_path_);
  if (unix_dir_made_) util::RemovePrivateSocketDir(unix_path_);
  for (int fd : {listen_fd_, unix_fd_, epoll_fd_, stop_fd_, spare_fd_}) {
    if (fd >= 0) close(fd);
  }
}

void BnSocketServer::Stop() {
  absl::MutexLock lock(&stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  port_.store(0);
  unix_listening_.store(false);
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof one);
  thread_.join();
}

int BnSocketServer::ConnectionCap(int64_t open_file_limit) {
  // A base for the process's own descriptors (stdio, epoll, gRPC's
  // internals, a checkpoint being written, the metrics listener), then half
  // of the rest for BN connections and half kept for gRPC's connections.
  constexpr int64_t kBase = 64;
  constexpr int64_t kMost = 65536;
  const int64_t cap = (open_file_limit - kBase) / 2;
  return static_cast<int>(std::clamp<int64_t>(cap, 0, kMost));
}

bool BnSocketServer::Accept(int listen_fd,
                            std::map<int, std::shared_ptr<Conn>>* conns) {
  // Bounded, so that the thread returns to its other connections, the
  // sweep and Stop however fast connections arrive.
  for (int i = 0; i < kAcceptsPerEvent; ++i) {
    sockaddr_storage from{};
    socklen_t from_len = sizeof from;
    int c = accept4(listen_fd, reinterpret_cast<sockaddr*>(&from), &from_len,
                    SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EMFILE && errno != ENFILE) return true;  // EAGAIN: done
      // Out of descriptors: take one connection with the spare descriptor
      // and close it, so that it does not wait in the backlog. The table
      // stays full (someone else holds the rest): the caller backs off
      // instead of trying again at once, which spun a core.
      if (spare_fd_ < 0) {
        spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
        return false;
      }
      close(spare_fd_);
      c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        accepted_.fetch_add(1);
        refused_.fetch_add(1);
        close(c);
      }
      spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
      return false;
    }
    accepted_.fetch_add(1);
    if (listen_fd == unix_fd_) accepted_unix_.fetch_add(1);
    const std::string peer = listen_fd == unix_fd_
                                 ? PeerOfUnix(c)
                                 : PeerOfTcp(from, from_len);
    auto by_peer = pending_by_peer_.find(peer);
    if ((by_peer != pending_by_peer_.end() &&
         by_peer->second >= options_.max_unauthenticated_per_peer) ||
        !util::SetLowLatency(c, "BN connection").ok()) {
      refused_.fetch_add(1);  // counted before the client sees the close
      close(c);  // refused before the descriptor table fills
      continue;
    }
    // The set of connections before their hello is full: the oldest of
    // them goes (it has had the longest to say hello).
    if (pending_ >= max_unauthenticated_ && !EvictOldestPending(conns)) {
      refused_.fetch_add(1);
      close(c);
      continue;
    }
    auto conn = std::make_shared<Conn>(c, epoll_fd_, options_.max_queued_bytes,
                                       budget_);
    if (listen_fd == unix_fd_) conn->transport = "unix";
    conn->peer = peer;
    conn->serial = next_serial_++;
    conn->in_budget = hello_budget_.get();
    epoll_event ev{};
    ev.events = kIn;
    ev.data.fd = c;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c, &ev) != 0) continue;  // closes c
    ++pending_;
    ++pending_by_peer_[peer];
    pending_order_.emplace_back(conn->serial, c);
    conns->emplace(c, std::move(conn));
    if (pending_order_.size() > 2 * static_cast<size_t>(pending_) + 64) {
      // Mostly connections past their hello or gone: keep the rest.
      std::deque<std::pair<uint64_t, int>> kept;
      for (const auto& [serial, fd] : pending_order_) {
        auto it = conns->find(fd);
        if (it != conns->end() && it->second->serial == serial &&
            it->second->pending) {
          kept.emplace_back(serial, fd);
        }
      }
      pending_order_.swap(kept);
    }
  }
  return true;
}

void BnSocketServer::Run() {
  std::map<int, std::shared_ptr<Conn>> conns;
  auto drop = [&](int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    Release(*it->second);
    conns.erase(it);  // closed once no answer holds it
  };
  // Out of descriptors, the listeners are taken off the epoll set until
  // `resume_listening` (backing off from kMinBackoff to kMaxBackoff): a
  // listener that stays readable while accept fails would wake the loop
  // at once, for ever.
  absl::Duration backoff = kMinBackoff;
  absl::Time resume_listening = absl::InfiniteFuture();
  auto arm_listener = [&](uint32_t events) {
    for (int fd : {listen_fd_, unix_fd_}) {
      if (fd < 0) continue;
      epoll_event ev{};
      ev.events = events;
      ev.data.fd = fd;
      epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
    }
  };
  epoll_event events[64];
  absl::Time next_sweep = absl::Now() + absl::Seconds(1);
  // Until when the loop polls rather than sleeps (Options::busy_poll).
  absl::Time poll_until = absl::InfinitePast();
  unsigned idle_polls = 0;
  for (;;) {
    const absl::Time before = absl::Now();
    const absl::Time wake = std::min(next_sweep, resume_listening);
    const bool polling = before < poll_until;
    const int timeout_ms =
        polling ? 0
                : static_cast<int>(std::clamp<int64_t>(
                      absl::ToInt64Milliseconds(wake - before) + 1, 0, 1000));
    const int n = epoll_wait(epoll_fd_, events, 64, timeout_ms);
    if (n < 0 && errno != EINTR) break;
    if (n > 0 && options_.busy_poll > absl::ZeroDuration()) {
      poll_until = absl::Now() + options_.busy_poll;
      idle_polls = 0;
    } else if (n == 0 && polling) {
      // Nothing yet: now and then hand the CPU to any other thread that is
      // ready (the gRPC service's), then poll again.
      util::PollPause(idle_polls++);
    }
    bool stop = false;
    for (int e = 0; e < n; ++e) {
      const int fd = events[e].data.fd;
      if (fd == stop_fd_) {
        stop = true;
        break;
      }
      if (fd == listen_fd_ || fd == unix_fd_) {
        if (Accept(fd, &conns)) {
          backoff = kMinBackoff;
        } else {
          if (backoff == kMinBackoff) {
            std::fprintf(stderr,
                         "bnps_server: BN over TCP: out of descriptors (%zu "
                         "BN connections open): not accepting for a while\n",
                         conns.size());
          }
          arm_listener(0);
          resume_listening = absl::Now() + backoff;
          backoff = std::min(backoff * 2, kMaxBackoff);
        }
        continue;
      }
      auto it = conns.find(fd);
      if (it == conns.end()) continue;  // dropped earlier in this batch
      std::shared_ptr<Conn> conn = it->second;
      bool keep = true;
      if (events[e].events & EPOLLOUT) keep = conn->Flush();
      if (keep && (events[e].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP |
                                       EPOLLERR))) {
        keep = Read(conn);
      }
      if (!keep) drop(fd);
    }
    if (stop) break;
    const absl::Time now = absl::Now();
    if (now >= resume_listening) {
      resume_listening = absl::InfiniteFuture();
      arm_listener(EPOLLIN);
    }
    // Connections that have not said hello in time, or that began a frame
    // long ago and have not finished it, are closed.
    if (now >= next_sweep) {
      next_sweep = now + absl::Seconds(1);
      for (int fd : LateConnections(conns, now)) drop(fd);
    }
  }
  for (auto& [fd, conn] : conns) Release(*conn);
  CloseListeners();
}

std::vector<int> BnSocketServer::LateConnections(
    const std::map<int, std::shared_ptr<Conn>>& conns, absl::Time now) const {
  std::vector<int> late;
  for (const auto& [fd, conn] : conns) {
    if (!conn->dispatcher.has_value() &&
        now - conn->opened > options_.hello_timeout) {
      late.push_back(fd);
    } else if (now - conn->frame_started > options_.frame_timeout) {
      std::fprintf(stderr,
                   "bnps_server: a BN connection began a frame %.1f s "
                   "ago and has sent %lld bytes of it: closed\n",
                   absl::ToDoubleSeconds(now - conn->frame_started),
                   static_cast<long long>(conn->reader.buffered()));
      late.push_back(fd);
    }
  }
  return late;
}

void BnSocketServer::CloseListeners() {
  port_.store(0);
  unix_listening_.store(false);
  close(listen_fd_);
  listen_fd_ = -1;
  if (unix_fd_ >= 0) {
    util::RemoveUnixListener(unix_listener_, unix_path_);
    if (unix_dir_made_) util::RemovePrivateSocketDir(unix_path_);
    close(unix_fd_);
    unix_fd_ = -1;
  }
}

bool BnSocketServer::EvictOldestPending(
    std::map<int, std::shared_ptr<Conn>>* conns) {
  while (!pending_order_.empty()) {
    const auto [serial, fd] = pending_order_.front();
    pending_order_.pop_front();
    auto it = conns->find(fd);
    if (it == conns->end() || it->second->serial != serial ||
        !it->second->pending) {
      continue;  // gone, or past its hello, since
    }
    evicted_.fetch_add(1);  // counted before the client sees the close
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    Release(*it->second);
    conns->erase(it);
    return true;
  }
  return false;
}

void BnSocketServer::LeavePending(Conn& conn) {
  if (!conn.pending) return;
  conn.pending = false;
  --pending_;
  auto it = pending_by_peer_.find(conn.peer);
  if (it != pending_by_peer_.end() && --it->second <= 0) {
    pending_by_peer_.erase(it);
  }
  // Nothing waits on the order of arrival any more: keep it from growing
  // with connections that said hello.
  if (pending_ == 0) pending_order_.clear();
}

void BnSocketServer::Release(Conn& conn) {
  // Everything the connection held is given back before its client can
  // see the close, so a client that saw it sees the budget free.
  LeavePending(conn);
  if (conn.dispatcher.has_value() && !conn.released) --authenticated_;
  conn.released = true;
  conn.admission.Release();
  if (conn.in_budget != nullptr) conn.in_budget->Release(conn.charged_in);
  conn.charged_in = 0;
  conn.reader = proto::FrameReader();  // an answer owed may keep conn alive
  conn.frame_started = absl::InfiniteFuture();
  conn.Shut();
}

bool BnSocketServer::Read(const std::shared_ptr<Conn>& conn) {
  char buf[kReadChunk];
  for (int chunk = 0; chunk < kChunksPerEvent; ++chunk) {
    // What is read is held (until its frame is whole) within the server's
    // budget: charged before the read, the rest given back after.
    // Before its hello, within the budget of such connections alone.
    util::ByteBudget& in = *conn->in_budget;
    const int64_t room = in.ChargeUpTo(kReadChunk);
    if (room == 0) {
      if (conn->pending) {
        LogRejected(*shard_, "BnSync (TCP)", -1,
                    absl::ResourceExhaustedError(
                        "the budget of BN connections before their hello is "
                        "spent: one shed"));
        return false;
      }
      std::fprintf(stderr,
                   "bnps_server: the server's BN memory budget (%lld bytes) "
                   "is spent: a BN connection holding %lld bytes of a frame "
                   "shed\n",
                   static_cast<long long>(budget_->limit()),
                   static_cast<long long>(conn->reader.buffered()));
      return false;
    }
    const ssize_t k = recv(conn->fd, buf, static_cast<size_t>(room), 0);
    const int64_t got = k > 0 ? k : 0;
    in.Release(room - got);
    if (k > 0) {
      conn->reader.Append(buf, static_cast<size_t>(k));
      conn->charged_in += got;
      int frames = 0;
      const bool keep = HandleFrames(conn, &frames);
      // Whole frames were handled: their bytes go back to the budget.
      const int64_t held = static_cast<int64_t>(conn->reader.buffered());
      in.Release(conn->charged_in - held);
      conn->charged_in = held;
      if (!conn->pending && conn->in_budget != budget_.get()) {
        // Past its hello: what it holds moves to the server's budget.
        in.Release(held);
        conn->charged_in = 0;
        conn->in_budget = budget_.get();
        if (!budget_->TryCharge(held)) return false;
        conn->charged_in = held;
      }
      if (held == 0 || frames > 0) conn->frame_started = absl::InfiniteFuture();
      if (held > 0 && conn->frame_started == absl::InfiniteFuture()) {
        conn->frame_started = absl::Now();
      }
      if (!keep) return false;
      if (got < room) return true;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // the end of the connection, or an error
  }
  return true;  // more to read: epoll says so again
}

bool BnSocketServer::HandleFrames(const std::shared_ptr<Conn>& conn,
                                  int* frames) {
  for (;;) {
    if (!conn->dispatcher.has_value() &&
        conn->reader.buffered() > max_hello_bytes_ + proto::kFrameHeaderBytes) {
      LogRejected(*shard_, "BnSync (TCP)", -1,
                  absl::InvalidArgumentError(absl::StrCat(
                      "a first frame of more than ", max_hello_bytes_,
                      " bytes, longer than any hello: connection closed")));
      return false;
    }
    absl::StatusOr<std::optional<absl::string_view>> frame = conn->reader.Next();
    if (!frame.ok()) {
      LogRejected(*shard_, "BnSync (TCP)", -1, frame.status());
      return false;
    }
    if (!frame->has_value()) return true;
    ++*frames;
    const absl::string_view bytes = **frame;
    if (!conn->dispatcher.has_value()) {
      if (!HandleHello(conn, bytes)) return false;
      continue;
    }
    if (keep_awake_ != nullptr) keep_awake_->Touch();
    if (metrics_) {
      metrics_->Received(M::kBnSync, bytes.size() + proto::kFrameHeaderBytes);
    }
    proto::BnRequest& req = conn->request;
    if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      LogRejected(*shard_, "BnSync (TCP)", -1,
                  absl::InvalidArgumentError("bytes that are no BnRequest"));
      return false;
    }
    ServerMetrics* metrics = metrics_;
    conn->dispatcher->Dispatch(
        req, [conn, metrics](const proto::BnResponse& resp) {
          // BnDispatcher answers within the message limit.
          std::string out;
          if (!proto::AppendFrame(resp, &out).ok()) {
            conn->Shut();
            return;
          }
          if (metrics) metrics->Sent(M::kBnSync, out.size());
          conn->Write(out);
        });
  }
}

}  // namespace bnps::server
