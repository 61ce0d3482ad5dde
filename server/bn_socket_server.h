// BnSocketServer: the shard's BN traffic over raw TCP (bnps.proto, BnHello),
// beside the gRPC BnSync stream. A BN exchange is latency-bound -- a few
// hundred bytes each way, a dozen times a step -- and over loopback a bare
// TCP round trip is several times faster than the same exchange through
// gRPC (docs/performance.md, the "tcp" and "star" peers). The messages,
// checks and answers are the stream's (server/bn_dispatch.h); only the
// transport differs.
//
// One thread waits on epoll for every connection, reads the frames, and
// dispatches the requests; an answer is written by the thread that
// completes its barrier (for the last worker to arrive, this thread), so a
// round costs no hand-off between threads. A connection starts with a
// BnHello (job, worker, generation, job token), answered by a BnHelloReply;
// a wrong token or job is answered and the connection closed. Bytes that are
// not frames of these messages close the connection. A client that does not
// read its answers for `write_timeout` is cut off.
//
// Plaintext only: a job served over TLS must not carry its BN statistics
// in the clear, so RunningServer refuses the listener with TLS.
//
// Thread-safety: thread-safe; answers may be sent from any thread.

#ifndef BNPS_SERVER_BN_SOCKET_SERVER_H_
#define BNPS_SERVER_BN_SOCKET_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/server_metrics.h"
#include "server/shard.h"
#include "util/keep_awake.h"

namespace bnps::server {

class BnSocketServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";  // an IPv4 address, or a name of one
    int port = 0;                    // 0: a free one
    std::string token;               // the job token; empty: none
    absl::Duration write_timeout = absl::Seconds(5);
  };

  // `shard`, `metrics` and `keep_awake` (both may be null) are not owned and
  // must outlive the server. UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<BnSocketServer>> Start(
      Shard* shard, ServerMetrics* metrics, util::KeepAwake* keep_awake,
      Options options);
  ~BnSocketServer();  // Stop()

  int port() const { return port_; }
  // Connections accepted so far.
  int64_t accepted() const { return accepted_.load(); }

  // Closes the listener and every connection; answers still owed are
  // dropped. Idempotent.
  void Stop();

 private:
  struct Conn;
  BnSocketServer(Shard* shard, ServerMetrics* metrics,
                 util::KeepAwake* keep_awake, Options options)
      : shard_(shard),
        metrics_(metrics),
        keep_awake_(keep_awake),
        options_(std::move(options)) {}
  void Run();
  // Handles the frames `conn` has received: false once it must close.
  bool HandleFrames(const std::shared_ptr<Conn>& conn);
  bool HandleHello(Conn& conn, absl::string_view frame);

  Shard* const shard_;
  ServerMetrics* const metrics_;
  util::KeepAwake* const keep_awake_;
  const Options options_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int stop_fd_ = -1;
  int port_ = 0;
  std::atomic<int64_t> accepted_{0};
  std::thread thread_;
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_BN_SOCKET_SERVER_H_
