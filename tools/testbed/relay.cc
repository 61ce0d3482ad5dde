#include "tools/testbed/relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace bnps::testbed {
namespace {

// Reading stops while this much waits in one direction (the sender then
// feels TCP's back-pressure, as over a real link).
constexpr size_t kMaxQueued = 4 << 20;
constexpr size_t kReadSize = 64 << 10;
constexpr uint32_t kUnwatched = ~uint32_t{0};  // a mask: not in the epoll set

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

absl::StatusOr<sockaddr_in> ParseAddress(absl::string_view text) {
  const size_t colon = text.rfind(':');
  int port = 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(text.substr(colon + 1), &port) || port <= 0 ||
      port > 65535 ||
      inet_pton(AF_INET, std::string(text.substr(0, colon)).c_str(),
                &a.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not IPV4:PORT"));
  }
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void CloseWithRst(int fd) {
  if (fd < 0) return;
  const linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close(fd);
}

}  // namespace

absl::StatusOr<Forward> ParseForward(const std::string& text) {
  const size_t eq = text.find('=');
  const size_t gt = text.find('>');
  if (eq == std::string::npos || gt == std::string::npos || gt < eq ||
      eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not LINK=LISTEN_IP:PORT>TARGET_IP:PORT"));
  }
  Forward f;
  f.link = text.substr(0, eq);
  absl::StatusOr<sockaddr_in> listen =
      ParseAddress(absl::string_view(text).substr(eq + 1, gt - eq - 1));
  if (!listen.ok()) return listen.status();
  absl::StatusOr<sockaddr_in> target =
      ParseAddress(absl::string_view(text).substr(gt + 1));
  if (!target.ok()) return target.status();
  f.listen = *listen;
  f.target = *target;
  return f;
}

Relay::Relay(int command_fd, int reply_fd, uint64_t seed, int64_t spin_ns)
    : command_fd_(command_fd),
      reply_fd_(reply_fd),
      spin_ns_(spin_ns),
      rng_(seed) {}

absl::StatusOr<std::unique_ptr<Relay>> Relay::Start(
    const std::vector<Forward>& forwards, const LinkSettings& settings,
    int command_fd, int reply_fd, uint64_t seed, int64_t spin_ns) {
  std::unique_ptr<Relay> r(new Relay(command_fd, reply_fd, seed, spin_ns));
  // Timers fire when asked, not up to 50 us later (the default slack).
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  r->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  r->timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (r->epoll_fd_ < 0 || r->timer_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("epoll: ", strerror(errno)));
  }
  r->forwards_ = forwards;
  for (size_t i = 0; i < forwards.size(); ++i) {
    std::unique_ptr<Link>& link = r->links_[forwards[i].link];
    if (link == nullptr) {
      link = std::make_unique<Link>();
      link->name = forwards[i].link;
      link->settings = settings;
    }
    const int fd =
        socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 ||
        bind(fd, reinterpret_cast<const sockaddr*>(&forwards[i].listen),
             sizeof(sockaddr_in)) != 0 ||
        listen(fd, 256) != 0) {
      const int err = errno;
      char ip[INET_ADDRSTRLEN] = "?";
      inet_ntop(AF_INET, &forwards[i].listen.sin_addr, ip, sizeof ip);
      if (fd >= 0) close(fd);
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", ip, ":",
                       ntohs(forwards[i].listen.sin_port), ": ",
                       strerror(err)));
    }
    r->listen_fds_.push_back(fd);
    r->listen_handles_.push_back(
        std::make_unique<Handle>(Handle{Handle::kListener, nullptr,
                                        static_cast<int>(i)}));
    epoll_event ev{EPOLLIN, {.ptr = r->listen_handles_.back().get()}};
    epoll_ctl(r->epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  epoll_event ev{EPOLLIN, {.ptr = &r->command_handle_}};
  epoll_ctl(r->epoll_fd_, EPOLL_CTL_ADD, command_fd, &ev);
  ev = {EPOLLIN, {.ptr = &r->timer_handle_}};
  epoll_ctl(r->epoll_fd_, EPOLL_CTL_ADD, r->timer_fd_, &ev);
  return r;
}

Relay::~Relay() {
  for (auto& c : conns_) {
    if (c->client >= 0) close(c->client);
    if (c->upstream >= 0) close(c->upstream);
  }
  for (int fd : listen_fds_) close(fd);
  if (timer_fd_ >= 0) close(timer_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void Relay::Run() {
  epoll_event events[64];
  while (!done_) {
    // Within spin_ns of the next release the loop polls instead of
    // sleeping: a timer's wake-up costs tens of microseconds on a VM.
    const int64_t next = NextRelease();
    const bool spin = next != 0 && next - NowNs() <= spin_ns_;
    if (!spin) ArmTimer(next == 0 ? 0 : next - spin_ns_);
    const int n = epoll_wait(epoll_fd_, events, 64, spin ? 0 : -1);
    if (n < 0 && errno != EINTR) return;
    for (int i = 0; i < n; ++i) {
      Handle* h = static_cast<Handle*>(events[i].data.ptr);
      switch (h->kind) {
        case Handle::kListener:
          Accept(h->index);
          break;
        case Handle::kCommand:
          ReadCommands();
          break;
        case Handle::kTimer: {
          uint64_t expirations;
          (void)!read(timer_fd_, &expirations, sizeof expirations);
          break;
        }
        case Handle::kClient:
        case Handle::kUpstream: {
          Conn* c = h->conn;
          if (c->dead) break;
          const bool client = h->kind == Handle::kClient;
          if (!client && c->connecting) {
            int err = 0;
            socklen_t len = sizeof err;
            getsockopt(c->upstream, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err != 0) {
              Reset(c);  // the target refused: so does the relay
              break;
            }
            if (events[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) {
              c->connecting = false;
              c->connected = true;
            }
          }
          if (events[i].events & EPOLLOUT) {
            (client ? c->down : c->up).blocked = false;
          }
          if (events[i].events & (EPOLLHUP | EPOLLERR)) {
            Hangup(c, client);
          } else if (events[i].events & EPOLLIN) {
            ReadFrom(c, client);
          }
          break;
        }
      }
    }
    const int64_t now = NowNs();
    for (auto& c : conns_) {
      if (c->dead || c->link->cut != Cut::kNone || !c->connected) continue;
      Pump(c.get(), &c->up, now);
      if (!c->dead) Pump(c.get(), &c->down, now);
    }
    for (auto& c : conns_) {
      if (!c->dead) UpdateMasks(c.get());
    }
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                                [](const std::unique_ptr<Conn>& c) {
                                  return c->dead;
                                }),
                 conns_.end());
  }
}

void Relay::Accept(int index) {
  Link* link = links_[forwards_[index].link].get();
  while (true) {
    const int fd =
        accept4(listen_fds_[index], nullptr, nullptr,
                SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    ++link->connections;
    if (link->cut == Cut::kRst) {
      CloseWithRst(fd);
      continue;
    }
    SetNoDelay(fd);
    auto c = std::make_unique<Conn>();
    c->link = link;
    c->forward = index;
    c->client = fd;
    c->client_handle = Handle{Handle::kClient, c.get()};
    c->upstream_handle = Handle{Handle::kUpstream, c.get()};
    epoll_event ev{0, {.ptr = &c->client_handle}};
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    if (link->cut == Cut::kNone) Connect(c.get());
    conns_.push_back(std::move(c));
  }
}

void Relay::Connect(Conn* c) {
  c->upstream = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->upstream < 0) {
    Reset(c);
    return;
  }
  SetNoDelay(c->upstream);
  c->up.from = c->down.to = c->client;
  c->up.to = c->down.from = c->upstream;
  const sockaddr_in& target = forwards_[c->forward].target;
  if (connect(c->upstream, reinterpret_cast<const sockaddr*>(&target),
              sizeof target) != 0 &&
      errno != EINPROGRESS) {
    Reset(c);
    return;
  }
  c->connecting = true;
  epoll_event ev{EPOLLOUT, {.ptr = &c->upstream_handle}};
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->upstream, &ev);
  c->upstream_mask = EPOLLOUT;
}

int64_t Relay::ReleaseTime(Link* link, Direction* d, int64_t now) {
  const LinkSettings& s = link->settings;
  int64_t t = now + s.delay_ns;
  if (s.jitter_ns > 0) {
    t += std::uniform_int_distribution<int64_t>(0, s.jitter_ns)(rng_);
  }
  if (s.loss > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < s.loss) {
    t += s.loss_penalty_ns;
  }
  // A byte stream stays in order: nothing overtakes what was sent before.
  d->last_release = std::max(d->last_release, t);
  return d->last_release;
}

void Relay::ReadFrom(Conn* c, bool from_client) {
  Direction* d = from_client ? &c->up : &c->down;
  const int fd = from_client ? c->client : c->upstream;
  if (d->eof_read || c->link->cut != Cut::kNone) return;
  char buf[kReadSize];
  const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  if (n > 0) {
    d->queue.push_back(
        Chunk{ReleaseTime(c->link, d, NowNs()), std::string(buf, n)});
    d->queued += n;
  } else if (n == 0) {
    d->eof_read = true;
    d->queue.push_back(Chunk{ReleaseTime(c->link, d, NowNs()), ""});
  } else if (errno != EAGAIN && errno != EINTR) {
    Reset(c);  // a reset at one end resets the other
  }
}

void Relay::Hangup(Conn* c, bool client) {
  const int fd = client ? c->client : c->upstream;
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (c->link->cut != Cut::kNone) {
    // Nothing crosses a cut link, not even a reset: it waits for the heal.
    c->doomed = true;
    Unwatch(c);
    return;
  }
  if (err != 0) {
    Reset(c);
    return;
  }
  Direction* d = client ? &c->up : &c->down;
  if (!d->eof_read) {
    ReadFrom(c, client);  // the rest of its bytes, then its FIN
    return;
  }
  // Both ways shut at this end: HUP would be reported for ever.
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  (client ? c->client_mask : c->upstream_mask) = kUnwatched;
}

void Relay::Unwatch(Conn* c) {
  for (auto [fd, mask] : {std::pair{c->client, &c->client_mask},
                          std::pair{c->upstream, &c->upstream_mask}}) {
    if (fd >= 0 && *mask != kUnwatched) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      *mask = kUnwatched;
    }
  }
}

void Relay::Pump(Conn* c, Direction* d, int64_t now) {
  while (!d->queue.empty() && !d->blocked) {
    Chunk& chunk = d->queue.front();
    if (chunk.release_ns > now) return;
    if (chunk.data.empty()) {
      shutdown(d->to, SHUT_WR);
      d->eof_sent = true;
      d->queue.pop_front();
      if (c->up.eof_sent && c->down.eof_sent) Close(c);
      return;
    }
    const ssize_t n = send(d->to, chunk.data.data() + chunk.offset,
                           chunk.data.size() - chunk.offset,
                           MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN) {
        d->blocked = true;
      } else if (errno != EINTR) {
        Reset(c);
      }
      return;
    }
    (d == &c->up ? c->link->bytes_up : c->link->bytes_down) += n;
    chunk.offset += n;
    d->queued -= n;
    if (chunk.offset == chunk.data.size()) d->queue.pop_front();
  }
}

void Relay::UpdateMasks(Conn* c) {
  if (c->doomed) return;
  const bool open = c->link->cut == Cut::kNone;
  uint32_t client_mask = 0, upstream_mask = 0;
  if (open && c->connected) {
    if (!c->up.eof_read && c->up.queued < kMaxQueued) client_mask |= EPOLLIN;
    if (!c->down.eof_read && c->down.queued < kMaxQueued) {
      upstream_mask |= EPOLLIN;
    }
    if (c->down.blocked) client_mask |= EPOLLOUT;
    if (c->up.blocked) upstream_mask |= EPOLLOUT;
  } else if (c->connecting) {
    upstream_mask = EPOLLOUT;
  }
  if (c->client_mask != kUnwatched && client_mask != c->client_mask) {
    epoll_event ev{client_mask, {.ptr = &c->client_handle}};
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c->client, &ev);
    c->client_mask = client_mask;
  }
  if (c->upstream >= 0 && c->upstream_mask != kUnwatched &&
      upstream_mask != c->upstream_mask) {
    epoll_event ev{upstream_mask, {.ptr = &c->upstream_handle}};
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c->upstream, &ev);
    c->upstream_mask = upstream_mask;
  }
}

void Relay::Reset(Conn* c) {
  if (c->dead) return;
  CloseWithRst(c->client);
  CloseWithRst(c->upstream);
  c->client = c->upstream = -1;
  c->dead = true;
}

void Relay::Close(Conn* c) {
  if (c->dead) return;
  close(c->client);
  close(c->upstream);
  c->client = c->upstream = -1;
  c->dead = true;
}

int64_t Relay::NextRelease() {
  int64_t next = 0;
  for (auto& c : conns_) {
    if (c->dead || c->link->cut != Cut::kNone || !c->connected) continue;
    for (Direction* d : {&c->up, &c->down}) {
      if (d->queue.empty() || d->blocked) continue;
      const int64_t t = d->queue.front().release_ns;
      if (next == 0 || t < next) next = t;
    }
  }
  return next;
}

void Relay::ArmTimer(int64_t next) {
  itimerspec spec{};
  if (next != 0) {
    spec.it_value.tv_sec = next / 1'000'000'000;
    spec.it_value.tv_nsec = next % 1'000'000'000;
    if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) {
      spec.it_value.tv_nsec = 1;  // zero would disarm it
    }
  }
  timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
}

void Relay::ReadCommands() {
  char buf[4096];
  const ssize_t n = read(command_fd_, buf, sizeof buf);
  if (n <= 0) {
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) done_ = true;
    return;
  }
  command_buffer_.append(buf, n);
  size_t nl;
  while ((nl = command_buffer_.find('\n')) != std::string::npos) {
    const std::string line = command_buffer_.substr(0, nl);
    command_buffer_.erase(0, nl + 1);
    const std::string reply = Command(line) + "\n";
    (void)!write(reply_fd_, reply.data(), reply.size());
  }
}

std::vector<Relay::Link*> Relay::Select(const std::string& name) {
  std::vector<Link*> out;
  for (auto& [n, link] : links_) {
    if (name == "*" || name == n) out.push_back(link.get());
  }
  return out;
}

std::string Relay::Command(const std::string& line) {
  const std::vector<std::string> w =
      absl::StrSplit(line, ' ', absl::SkipWhitespace());
  if (w.empty()) return "error: empty command";
  if (w[0] == "quit") {
    done_ = true;
    return "ok";
  }
  if (w[0] == "stats") {
    std::string out;
    for (auto& [name, link] : links_) {
      int64_t open = 0;
      for (auto& c : conns_) open += !c->dead && c->link == link.get();
      absl::StrAppend(&out, out.empty() ? "" : " ", name, ":conns=",
                      link->connections, ",open=", open,
                      ",up=", link->bytes_up, ",down=", link->bytes_down);
    }
    return out.empty() ? "none" : out;
  }
  if (w.size() < 2) return absl::StrCat("error: '", line, "' names no link");
  const std::vector<Link*> links = Select(w[1]);
  if (links.empty()) return absl::StrCat("error: no link '", w[1], "'");
  auto number = [&](size_t i, double fallback, double* out) {
    if (i >= w.size()) {
      *out = fallback;
      return true;
    }
    return absl::SimpleAtod(w[i], out) && *out >= 0;
  };
  if (w[0] == "delay") {
    double delay_us, jitter_us;
    if (w.size() < 3 || !number(2, 0, &delay_us) || !number(3, 0, &jitter_us)) {
      return "error: delay LINK US [JITTER_US]";
    }
    for (Link* l : links) {
      l->settings.delay_ns = static_cast<int64_t>(delay_us * 1000);
      l->settings.jitter_ns = static_cast<int64_t>(jitter_us * 1000);
    }
    return "ok";
  }
  if (w[0] == "loss") {
    double p, penalty_us;
    if (w.size() < 3 || !number(2, 0, &p) || p > 1 ||
        !number(3, 200'000, &penalty_us)) {
      return "error: loss LINK P [PENALTY_US]";
    }
    for (Link* l : links) {
      l->settings.loss = p;
      l->settings.loss_penalty_ns = static_cast<int64_t>(penalty_us * 1000);
    }
    return "ok";
  }
  if (w[0] == "cut") {
    if (w.size() != 3 || (w[2] != "blackhole" && w[2] != "rst")) {
      return "error: cut LINK blackhole|rst";
    }
    const Cut cut = w[2] == "rst" ? Cut::kRst : Cut::kBlackhole;
    for (Link* l : links) {
      l->cut = cut;
      if (cut != Cut::kRst) continue;
      for (auto& c : conns_) {
        if (c->link == l) Reset(c.get());
      }
    }
    for (auto& c : conns_) {
      if (!c->dead) UpdateMasks(c.get());
    }
    return "ok";
  }
  if (w[0] == "heal") {
    for (Link* l : links) l->cut = Cut::kNone;
    for (auto& c : conns_) {
      if (c->doomed && c->link->cut == Cut::kNone) Reset(c.get());
      // Connections accepted while the link was cut connect now.
      if (!c->dead && c->upstream < 0 && c->link->cut == Cut::kNone) {
        Connect(c.get());
      }
    }
    return "ok";
  }
  return absl::StrCat("error: unknown command '", w[0], "'");
}

}  // namespace bnps::testbed
