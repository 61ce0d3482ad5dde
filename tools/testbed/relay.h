// A TCP relay that stands in for a network link between test-bed hosts
// (tools/testbed/README.md): it accepts connections on listening addresses,
// connects each to its target, and forwards the bytes of each direction after
// a one-way delay (plus jitter and a loss penalty), in order. A link can be
// cut and healed while connections are open:
//  - blackhole: nothing crosses either way (no RST, no FIN): data waits in the
//    relay and the kernel's buffers, as TCP's retransmissions would keep it
//    waiting, and crosses once the link heals; new connections are accepted
//    and held.
//  - rst: every open connection of the link is reset at both ends, and new
//    ones are reset as they arrive, until the link heals.
// Loss cannot drop bytes from a byte stream; it is modelled as what a lost
// segment costs TCP: with probability `loss`, a chunk waits `loss_penalty`
// more (Linux's minimum retransmission timeout is 200 ms).
//
// Thread-safety: not thread-safe; one thread runs Run() and all commands are
// read from the command fd inside it. Errors: Start fails with UNAVAILABLE
// when a listening address cannot be bound.

#ifndef BNPS_TOOLS_TESTBED_RELAY_H_
#define BNPS_TOOLS_TESTBED_RELAY_H_

#include <netinet/in.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace bnps::testbed {

// One listening address and where its connections go, on a named link
// (several ports may share one link, e.g. a server's gRPC and BN ports).
struct Forward {
  std::string link;
  sockaddr_in listen{};
  sockaddr_in target{};
};

// "LINK=LISTEN_IP:PORT>TARGET_IP:PORT". INVALID_ARGUMENT when malformed.
absl::StatusOr<Forward> ParseForward(const std::string& text);

struct LinkSettings {
  int64_t delay_ns = 0;   // one way, each direction
  int64_t jitter_ns = 0;  // uniform in [0, jitter] more per chunk
  double loss = 0;        // probability that a chunk pays loss_penalty
  int64_t loss_penalty_ns = 200'000'000;
};

class Relay {
 public:
  // Binds every forward's listening address. `command_fd` (not owned) gives
  // commands, one a line; each is answered with one line on `reply_fd`.
  // Within `spin_ns` of a release the relay polls instead of sleeping.
  static absl::StatusOr<std::unique_ptr<Relay>> Start(
      const std::vector<Forward>& forwards, const LinkSettings& settings,
      int command_fd, int reply_fd, uint64_t seed, int64_t spin_ns);
  ~Relay();

  // Serves until the command fd reaches end of file or "quit" arrives.
  void Run();

  // A command line ("delay LINK US [JITTER_US]", "loss LINK P [PENALTY_US]",
  // "cut LINK blackhole|rst", "heal LINK", "stats"; LINK may be "*"); the
  // reply ("ok", "error: ...", or the stats).
  std::string Command(const std::string& line);

 private:
  enum class Cut { kNone, kBlackhole, kRst };
  struct Link {
    std::string name;
    LinkSettings settings;
    Cut cut = Cut::kNone;
    int64_t connections = 0;  // accepted, ever
    int64_t bytes_up = 0;     // client to target, delivered
    int64_t bytes_down = 0;
  };
  struct Chunk {
    int64_t release_ns;
    std::string data;  // empty: the sender's FIN
    size_t offset = 0;
  };
  struct Conn;
  // What an epoll event points to.
  struct Handle {
    enum Kind { kListener, kClient, kUpstream, kCommand, kTimer } kind;
    Conn* conn = nullptr;
    int index = 0;  // the listener's forward
  };
  struct Direction {
    int from = -1, to = -1;
    std::deque<Chunk> queue;
    size_t queued = 0;
    int64_t last_release = 0;
    bool eof_read = false;  // the sender's FIN is queued
    bool eof_sent = false;
    bool blocked = false;  // the receiver's buffer is full
  };
  struct Conn {
    Link* link = nullptr;
    int forward = 0;
    int client = -1, upstream = -1;
    bool connecting = false, connected = false;
    Direction up, down;  // up: client to target
    Handle client_handle, upstream_handle;
    uint32_t client_mask = 0, upstream_mask = 0;
    bool dead = false;
    bool doomed = false;  // hung up while its link was cut: reset at heal
  };

  Relay(int command_fd, int reply_fd, uint64_t seed, int64_t spin_ns);
  void Accept(int index);
  void Connect(Conn* c);
  void ReadFrom(Conn* c, bool from_client);
  void Hangup(Conn* c, bool client);  // EPOLLHUP or EPOLLERR
  void Unwatch(Conn* c);
  void Pump(Conn* c, Direction* d, int64_t now);
  void Reset(Conn* c);  // RST both ends
  void Close(Conn* c);
  void UpdateMasks(Conn* c);
  int64_t NextRelease();  // 0: nothing waits
  void ArmTimer(int64_t at_ns);  // 0: disarm
  void ReadCommands();
  int64_t ReleaseTime(Link* link, Direction* d, int64_t now);
  std::vector<Link*> Select(const std::string& name);

  const int command_fd_, reply_fd_;
  const int64_t spin_ns_;
  int epoll_fd_ = -1, timer_fd_ = -1;
  std::mt19937_64 rng_;
  std::vector<Forward> forwards_;
  std::vector<int> listen_fds_;
  std::vector<std::unique_ptr<Handle>> listen_handles_;
  std::map<std::string, std::unique_ptr<Link>> links_;
  std::vector<std::unique_ptr<Conn>> conns_;
  Handle command_handle_{Handle::kCommand}, timer_handle_{Handle::kTimer};
  std::string command_buffer_;
  bool done_ = false;
};

}  // namespace bnps::testbed

#endif  // BNPS_TOOLS_TESTBED_RELAY_H_
