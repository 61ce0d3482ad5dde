// BnSocketServer: the shard's BN traffic over raw TCP (bnps.proto, BnHello),
// beside the gRPC BnSync stream. A BN exchange is latency-bound -- a few
// hundred bytes each way, a dozen times a step -- and over loopback a bare
// TCP round trip is 1.9-4.7 times faster than the same barrier through
// gRPC (docs/performance.md, the "tcp" and "star" peers). The messages,
// checks and answers are the stream's (server/bn_dispatch.h); only the
// transport differs. IPv4 only, and, with Options::unix_path, a Unix
// stream socket beside it for the workers of the server's host: the same
// hello, admission, limits and frames over a cheaper byte stream than
// loopback TCP. A hello's reply names the server process
// (Shard::server_incarnation), so a client can tell that the server at a
// path is the one it registered with. The
// socket file is made 0600 (util/unix_socket.h: a stale one is replaced,
// anything else at the path refused) and removed when the server stops.
//
// One thread waits on epoll for every connection, reads the frames, and
// dispatches the requests. An answer is written by the thread that
// completes its barrier (for the last worker to arrive, this thread), so a
// round costs no hand-off between threads; writes never block: what the
// socket does not take at once is queued and flushed by the epoll thread.
// A connection starts with a BnHello (job, worker, generation, job token),
// answered by a BnHelloReply; a wrong token or job is answered and the
// connection closed. A connection acts as the worker its hello named:
// requests that name another are refused (PERMISSION_DENIED). Until its hello a connection may send one small frame
// (MaxHelloBytes) and must send it within `hello_timeout`. Connections
// before their hello spend nothing of the workers': at most
// `max_unauthenticated` of them are open (a newcomer past it closes the
// oldest of them, so a flood cannot keep a worker's hello out for longer
// than the flood takes to refill the set), at most
// `max_unauthenticated_per_peer` from one address (more are closed on
// arrival), and what they have sent is held within a budget of their own
// (`unauthenticated_budget_bytes`). At most `max_connections` have said
// hello (a hello past it is refused, RESOURCE_EXHAUSTED: by default a cap
// derived from the descriptor limit, so that descriptors remain for the
// gRPC listener and its connections). Out of descriptors all the same (EMFILE), the listener
// rests, backing off from 10 ms to 1 s, instead of retrying at once. Bytes
// that are not frames of these messages close the connection, and so does
// a client that leaves more than `max_queued_bytes` of answers unread.
// Together the connections hold at most `memory_budget_bytes` (unread
// answers and partial frames; see Options), and a frame begun must be whole
// within `frame_timeout`.
//
// Plaintext only: a job served over TLS must not carry its BN statistics
// in the clear, so RunningServer refuses the listener with TLS.
//
// Lifetimes: an answer still owed after Stop holds its connection (and so
// the shard and metrics it was dispatched with) until the barrier fails or
// completes; RunningServer expires every barrier after Stop, before the
// shard and metrics go.
//
// A host's BN aggregator (hostbn/aggregator.h) names several workers in its
// hello (with the job token) and sends batches, one frame per layer, phase
// and step for all of them (server/bn_batch_dispatch.h).
//
// Thread-safety: thread-safe; answers may be sent from any thread.

#ifndef BNPS_SERVER_BN_SOCKET_SERVER_H_
#define BNPS_SERVER_BN_SOCKET_SERVER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/bnps.pb.h"
#include "server/bn_dispatch.h"
#include "server/server_metrics.h"
#include "security/worker_token.h"
#include "server/shard.h"
#include "util/byte_budget.h"
#include "util/keep_awake.h"
#include "util/unix_socket.h"

namespace bnps::server {

class BnSocketServer {
 public:
  // The largest frame a connection may send before its hello: the size of
  // the largest valid BnHello for `job` (a token of the most characters
  // security/job_token.h allows, the longest encodings of worker and
  // generation, every one of `num_workers` worker ids a host's aggregator
  // may name), computed, not guessed (a 4 KiB bound would refuse valid
  // tokens of 4,088 characters and more).
  static size_t MaxHelloBytes(const std::string& job, int num_workers = 1);

  struct Options {
    std::string host = "127.0.0.1";  // an IPv4 address, or a name of one
    int port = 0;                    // 0: a free one
    std::string token;               // the job token; empty: none
    // With `token`: each worker may use its own token (security/
    // worker_token.h), which acts as that worker only, and a worker has at
    // most one live connection (a second hello is refused).
    bool per_worker_tokens = false;
    absl::Duration hello_timeout = absl::Seconds(5);
    // Most BN connections past their hello at once; 0: ConnectionCap(the
    // soft RLIMIT_NOFILE when the server starts).
    int max_connections = 0;
    // Most connections open before their hello; 0: an eighth of
    // max_connections, at least 16 and at most 1,024 (descriptors for them
    // come on top of max_connections: ConnectionCap leaves room).
    int max_unauthenticated = 0;
    // Most of those from one address (Unix: one uid); more are closed on
    // arrival.
    int max_unauthenticated_per_peer = 64;
    // What connections before their hello may hold together (partial
    // hellos), apart from memory_budget_bytes: 0 for max_unauthenticated
    // largest hellos.
    int64_t unauthenticated_budget_bytes = 0;
    // Answers a client may leave unread before it is cut off.
    int64_t max_queued_bytes = kMaxUnreadAnswerBytes;
    // What all BN connections together may hold: answers not read yet and
    // frames partly received. Past it, an answer that would be queued cuts
    // its connection off, a connection with bytes to read is shed, and a
    // request whose answer would not fit is refused (RESOURCE_EXHAUSTED).
    int64_t memory_budget_bytes = int64_t{256} << 20;
    // The budget itself, when shared with the gRPC BnSync streams (then
    // memory_budget_bytes is ignored); null: one of memory_budget_bytes.
    std::shared_ptr<util::ByteBudget> budget;
    // A frame begun must be whole within this, or the connection is
    // closed (a sender that stops mid-frame holds its bytes otherwise).
    absl::Duration frame_timeout = absl::Seconds(10);
    // Non-empty: also accept on a Unix stream socket at this path ("auto":
    // util::MakePrivateSocketPath's, in a private directory of its own). Counts with the TCP
    // connections toward max_connections and the budget.
    std::string unix_path;
    // Above zero: for this long after each message the listener's thread
    // polls its connections (epoll without sleeping, yielding the CPU to
    // any other ready thread between polls) instead of blocking, so that a
    // worker's next request finds it running: no wake-up of a sleeping
    // thread (an interrupt to its CPU; tens of microseconds on a virtual
    // machine) in the round trip. bnps_server gives it --keep_awake_us.
    absl::Duration busy_poll = absl::ZeroDuration();
  };

  // `shard`, `metrics` and `keep_awake` (both may be null) are not owned and
  // must outlive the server and every answer owed (see above). UNAVAILABLE
  // if the address cannot be bound or is not IPv4; for the Unix path, what
  // util::ListenUnix says (INVALID_ARGUMENT for a path too long,
  // ALREADY_EXISTS for one in use).
  static absl::StatusOr<std::unique_ptr<BnSocketServer>> Start(
      Shard* shard, ServerMetrics* metrics, util::KeepAwake* keep_awake,
      Options options);
  ~BnSocketServer();  // Stop()

  // The port it listens on; 0 once stopped (what registering workers are
  // told).
  int port() const { return port_.load(); }
  // The Unix socket's path; empty without one, or once stopped.
  std::string unix_path() const {
    return unix_listening_.load() ? unix_path_ : std::string();
  }
  // Connections accepted so far (those closed on arrival included).
  int64_t accepted() const { return accepted_.load(); }
  // Of those, the ones that came over the Unix socket.
  int64_t accepted_unix() const { return accepted_unix_.load(); }
  // Of all accepted, the ones closed on arrival (over a peer's cap, or
  // taken with the spare descriptor when out of descriptors).
  int64_t refused() const { return refused_.load(); }
  // Connections closed before their hello to make room for a newer one
  // (max_unauthenticated).
  int64_t evicted() const { return evicted_.load(); }
  // The caps in force.
  int max_connections() const { return max_connections_; }
  int max_unauthenticated() const { return max_unauthenticated_; }
  // What the connections hold now (unread answers, partial frames), always
  // at most Options::memory_budget_bytes; shared, so that it may be read
  // (a metrics gauge) after the server is gone.
  std::shared_ptr<const util::ByteBudget> memory() const { return budget_; }

  // The BN connections a process with `open_file_limit` descriptors may
  // hold: half of what remains after 64 kept for the process itself, the
  // other half kept for gRPC's connections; at most 65,536.
  static int ConnectionCap(int64_t open_file_limit);

  // Closes the listener and every connection; answers still owed are
  // dropped. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(stop_mu_);

  // One client connection; internal (server/bn_socket_conn.h).
  struct Conn;

 private:
  BnSocketServer(Shard* shard, ServerMetrics* metrics,
                 util::KeepAwake* keep_awake, Options options)
      : shard_(shard),
        metrics_(metrics),
        keep_awake_(keep_awake),
        options_(std::move(options)) {}
  void Run();
  // Accepts what is pending (a bounded number); false when out of
  // descriptors, so that the caller rests the listener.
  bool Accept(int listen_fd, std::map<int, std::shared_ptr<Conn>>* conns);
  // Reads what `conn` has sent (a bounded amount per call) and handles its
  // frames: false once it must close.
  bool Read(const std::shared_ptr<Conn>& conn);
  // Handles the whole frames read, counting them in `frames`.
  bool HandleFrames(const std::shared_ptr<Conn>& conn, int* frames);
  // The hello's frames (security/bn_handshake.h): the hello, then in a job
  // with a token the client's proof; false once the connection must close.
  bool HandleHello(const std::shared_ptr<Conn>& conn, absl::string_view frame);
  // Admits the hello's connection as `caller` (who its proof showed) and
  // answers it; false if refused.
  bool AdmitHello(const std::shared_ptr<Conn>& conn, const proto::BnHello& hello,
                  int caller);
  // Shuts `conn` and gives back what its reading side held.
  void Release(Conn& conn);
  // Takes `conn` out of the count of connections before their hello (once
  // admitted or closed); idempotent.
  void LeavePending(Conn& conn);
  // Closes the oldest connection still before its hello; false if none.
  bool EvictOldestPending(std::map<int, std::shared_ptr<Conn>>* conns);
  // Run's sweep: the connections past the hello timeout before their hello,
  // or past the frame timeout in a frame (said on stderr).
  std::vector<int> LateConnections(
      const std::map<int, std::shared_ptr<Conn>>& conns, absl::Time now) const;
  // Run's end: closes the listeners (and removes the Unix socket).
  void CloseListeners();

  Shard* const shard_;
  ServerMetrics* const metrics_;
  util::KeepAwake* const keep_awake_;
  const Options options_;
  int listen_fd_ = -1;
  int unix_fd_ = -1;            // -1: no Unix socket
  util::UnixListener unix_listener_;
  std::string unix_path_;       // constant after Start
  bool unix_dir_made_ = false;  // unix_path_'s directory is ours to remove
  std::atomic<bool> unix_listening_{false};
  int epoll_fd_ = -1;
  int stop_fd_ = -1;
  int spare_fd_ = -1;  // closed to accept (and close) a connection at EMFILE
  int max_connections_ = 0;  // constant after Start
  int max_unauthenticated_ = 0;  // constant after Start
  // The epoll thread's alone: connections before their hello, by peer and
  // in order of arrival (serial, fd; entries of connections gone since are
  // skipped), and those past it.
  std::map<std::string, int> pending_by_peer_;
  std::deque<std::pair<uint64_t, int>> pending_order_;
  int pending_ = 0;
  int authenticated_ = 0;
  uint64_t next_serial_ = 0;
  std::shared_ptr<util::ByteBudget> hello_budget_;  // constant after Start
  size_t max_hello_bytes_ = 0;  // constant after Start
  std::shared_ptr<util::ByteBudget> budget_;  // constant after Start
  std::unique_ptr<security::TokenAuthenticator> auth_;  // constant after Start
  std::atomic<int> port_{0};
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> accepted_unix_{0};
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> evicted_{0};
  std::thread thread_;
  absl::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_BN_SOCKET_SERVER_H_
