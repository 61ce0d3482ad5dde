#include "bench/tcp_star.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "util/socket_io.h"

namespace bnps::bench {
namespace {

constexpr size_t kHeaderBytes = 8;
constexpr uint32_t kMaxPayload = 1 << 20;
constexpr uint32_t kMaxGroup = 4096;

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat("tcp: ", what, ": ", strerror(errno)));
}

void NoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;  // little-endian hosts only (x86-64, aarch64)
}

void StoreU32(char* p, uint32_t v) { std::memcpy(p, &v, sizeof v); }

// Writes all of `data` within 10 s (util/socket_io.h). False if the
// connection failed or the peer did not read.
bool SendAll(int fd, const char* data, size_t n) {
  return util::SendAll(fd, data, n, absl::Now() + absl::Seconds(10)).ok();
}

bool RecvAll(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t k = recv(fd, data, n, 0);
    if (k > 0) {
      data += k;
      n -= static_cast<size_t>(k);
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

// One worker's connection on the server.
struct Conn {
  std::string in;     // bytes read and not yet taken as a frame
  std::string frame;  // the frame that waits for its group
};

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStarServer>> TcpStarServer::Start() {
  std::unique_ptr<TcpStarServer> s(new TcpStarServer());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  absl::StatusOr<util::Listener> listener = util::ListenTcp(addr, 128);
  if (!listener.ok()) return listener.status();
  s->listen_fd_ = listener->fd;
  s->port_ = listener->port;
  s->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (s->epoll_fd_ < 0) return Errno("epoll_create1");
  s->stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->stop_fd_ < 0) return Errno("eventfd");
  for (int fd : {s->listen_fd_, s->stop_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(s->epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return Errno("epoll_ctl");
    }
  }
  s->thread_ = std::thread([p = s.get()] { p->Run(); });
  return s;
}

TcpStarServer::~TcpStarServer() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  for (int fd : {listen_fd_, epoll_fd_, stop_fd_}) {
    if (fd >= 0) close(fd);
  }
}

void TcpStarServer::Run() {
  std::map<int, Conn> conns;
  // Per group size, the connections whose frame waits for the rest.
  std::map<uint32_t, std::vector<int>> waiting;
  // Closes `fd`. A worker gone in the middle of a round fails its round:
  // the members waiting with it are closed too (they see the end of the
  // stream instead of waiting for ever).
  auto close_one = [&](int fd) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    conns.erase(fd);
  };
  auto drop = [&](int fd) {
    for (auto& [group, fds] : waiting) {
      if (std::find(fds.begin(), fds.end(), fd) == fds.end()) continue;
      for (int m : fds) {
        if (m != fd) close_one(m);
      }
      fds.clear();
    }
    close_one(fd);
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
        for (auto& [c, conn] : conns) close(c);
        return;
      }
      if (fd == listen_fd_) {
        for (;;) {
          const int c = accept4(listen_fd_, nullptr, nullptr,
                                SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;
          NoDelay(c);
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.fd = c;
          if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c, &ev) != 0) {
            close(c);
            continue;
          }
          conns.emplace(c, Conn());
        }
        continue;
      }
      auto it = conns.find(fd);
      if (it == conns.end()) continue;
      Conn& conn = it->second;
      bool closed = false;
      for (;;) {
        const ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k > 0) {
          conn.in.append(buf, static_cast<size_t>(k));
          continue;
        }
        if (k < 0 && errno == EINTR) continue;
        closed = k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
        break;
      }
      while (!closed && conn.frame.empty() && conn.in.size() >= kHeaderBytes) {
        const uint32_t payload = LoadU32(conn.in.data());
        const uint32_t group = LoadU32(conn.in.data() + 4);
        if (payload > kMaxPayload || group < 1 || group > kMaxGroup) {
          closed = true;  // not a frame of ours
        } else if (conn.in.size() < kHeaderBytes + payload) {
          break;  // the rest of the frame is still on its way
        } else {
          conn.frame = conn.in.substr(0, kHeaderBytes + payload);
          conn.in.erase(0, kHeaderBytes + payload);
          std::vector<int>& members = waiting[group];
          members.push_back(fd);
          if (members.size() >= group) {
            for (int m : members) {
              Conn& mc = conns[m];
              SendAll(m, mc.frame.data(), mc.frame.size());
              mc.frame.clear();
            }
            members.clear();
          }
        }
      }
      if (closed) drop(fd);
    }
  }
}

absl::StatusOr<std::vector<double>> TcpStarWorker(const Job& job,
                                                  RowControl* control) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(job.port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    absl::Status s = Errno(absl::StrCat("connect 127.0.0.1:", job.port));
    close(fd);
    control->stop.store(true);
    return s;
  }
  NoDelay(fd);
  // A round never waits past a minute (a peer that died).
  const timeval minute{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &minute, sizeof minute);
  const uint32_t payload = static_cast<uint32_t>(16 * job.channels + 8);
  std::string frame(kHeaderBytes + payload, 'x');
  StoreU32(frame.data(), payload);
  StoreU32(frame.data() + 4, static_cast<uint32_t>(job.workers));
  std::string reply(frame.size(), '\0');
  std::vector<double> us;
  absl::Status status;
  CallPlan plan(job, control);
  for (int i = 0; plan.MayStart(i) && KeepGoing(job, control); ++i) {
    const Clock::time_point t0 = Clock::now();
    if (!SendAll(fd, frame.data(), frame.size()) ||
        !RecvAll(fd, reply.data(), reply.size())) {
      status = Errno("a round");
      control->stop.store(true);
      break;
    }
    if (reply != frame) {
      status = absl::DataLossError("tcp: the server answered other bytes");
      control->stop.store(true);
      break;
    }
    if (i >= job.warmup) us.push_back(MicrosSince(t0));
    plan.Finished(i);
  }
  close(fd);
  if (!status.ok()) return status;
  return us;
}

absl::StatusOr<Latency> TcpStarLatency(WorkerPool& pool,
                                       const TcpStarServer& server,
                                       int channels, int workers,
                                       const Settings& s) {
  Job job = RowJob(Peer::kTcp, channels, workers, s);
  job.port = server.port();
  return pool.Run(job);
}

}  // namespace bnps::bench
