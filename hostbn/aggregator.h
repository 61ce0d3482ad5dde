// Aggregator: a host's BN aggregator. The workers of one host point their
// BN traffic at it (GrpcClientOptions::bn_host_aggregator, bnps_worker
// --bn_host_aggregator) instead of at the shards; it speaks the shards'
// raw-TCP BN protocol (bnps.proto, BnHello) to them and to the shards, and
// for each shard sends ONE frame per (layer, phase, step) carrying the
// requests of all its workers (a batch, hostbn/batcher.h), then hands each
// worker its answer from the shard's one reply. The shard merges the
// contributions in worker order exactly as when each worker sends its own
// (server/bn_batch_dispatch.h), so results are bitwise the same.
// BN groups (--bn_group_size) need nothing here: the shard answers each
// entry of a frame with its worker's group's merge, so a host's workers may
// span groups (host_bn_test: GroupsThroughOneAggregatorGetTheirGroupsMerges).
//
// A worker's hello names, in `upstream`, the shard's BN address its
// requests are for, which must be one of the aggregator's own shards
// (Options::shards), so that it is no relay to an address a worker names
// (without shards, any: in a job with a token the far side must still prove
// the job's key before anything but the hello reaches it). The
// workers of one (upstream, job, generation) form a group, and once
// `workers` of them have said hello the aggregator opens one connection to
// that shard with a hello naming them all. Until then their requests wait.
//
// Tokens: the aggregator holds the job token, as the servers do. Neither
// side of either connection sends it: each hello is a handshake
// (security/bn_handshake.h) in which the listening side proves its key
// first. A worker proves the job token or, with per_worker_tokens, its own
// (security/worker_token.h); the shard must prove the job token before the
// aggregator says anything more, so a fake shard learns nothing. Errors: a refused hello is answered and the connection closed; a
// worker whose connection closes holds up no round of its peers (the shard
// waits for it or fails the barrier naming it, hostbn/batcher.h); a shard
// connection that breaks or refuses the hello fails every request waiting
// on it with UNAVAILABLE naming the shard and closes its group's workers'
// connections (they reconnect, and a new group opens a new one), after
// the failure answers reached them.
//
// Writes: no group lock is held across a write, no write blocks, and no
// thread waits on another connection's socket. Each connection is written
// only by its own thread (hostbn/conn.h): answers and frames for it are
// queued, in the order the batcher decided them, and written as its socket
// takes them. So a worker
// that stops reading its answers holds up none of its peers. A peer that
// takes no byte for `timeout` while frames wait, or whose queue would pass
// kMaxQueuedBytes, is cut off: a worker's connection ends; a shard's
// breaks its group (above).
//
// Thread-safety: thread-safe. A thread per connection (workers and shards).

#ifndef BNPS_HOSTBN_AGGREGATOR_H_
#define BNPS_HOSTBN_AGGREGATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "hostbn/aggregator_metrics.h"
#include "proto/bnps.pb.h"
#include "security/worker_token.h"
#include "util/log_limiter.h"

namespace bnps::hostbn {

class Conn;

class Aggregator {
 public:
  // Bytes one connection may have queued and not yet written (two frames
  // of the largest size, proto::kMaxMessageBytes); past it the connection
  // is cut off.
  static constexpr size_t kMaxQueuedBytes = 16 << 20;

  struct Options {
    std::string host = "127.0.0.1";  // an IPv4 address, or a name of one
    int port = 0;                    // 0: a free one
    int workers = 1;  // the host's workers (each shard's group waits for all)
    std::string token;               // the job token; empty: none
    // The shards this aggregator may connect to: "host:port" (a shard's BN
    // address, as its registration advertises it) or "host" (any port of
    // that host); a hello naming another is refused. Empty: any (see
    // above). Default: empty.
    std::set<std::string> shards;
    bool per_worker_tokens = false;  // workers may use their own tokens
    int num_workers = 0;  // the job's workers (per_worker_tokens needs it)
    absl::Duration timeout = absl::Seconds(5);  // hellos, connects, writes
    // Connections (each with its thread) before their hello is settled;
    // more are closed on arrival, so that connections that never say
    // hello hold at most this many threads, each for at most `timeout`.
    int max_unauthenticated = 64;
    // Connections open at once, past their hello or not; more are closed
    // on arrival.
    int max_connections = 4096;
    // What it measures (not owned; must outlive the aggregator); null: none.
    AggregatorMetrics* metrics = nullptr;
  };

  // UNAVAILABLE if the address cannot be bound; INVALID_ARGUMENT for
  // options that do not fit (workers < 1, per_worker_tokens
  // without a token or num_workers).
  static absl::StatusOr<std::unique_ptr<Aggregator>> Start(Options options);

  // Whether `upstream` ("host:port") is one of Options::shards.
  bool IsOwnShard(const std::string& upstream) const;
  ~Aggregator();  // Stop()

  int port() const { return port_; }
  // Connections closed on arrival (over max_unauthenticated or
  // max_connections).
  int64_t refused() const { return refused_.load(); }

  // Closes the listener and every connection and waits for their threads.
  // Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Group;
  using GroupKey = std::tuple<std::string, std::string, int64_t>;

  explicit Aggregator(Options options);
  void AcceptLoop();
  void Serve(std::shared_ptr<Conn> conn);
  // Serve's parts, in order. Authenticate: the hello's handshake (*gone:
  // the connection closed meanwhile). CheckUpstream: the hello names one of
  // the shards this aggregator relays to. JoinGroup: the worker takes its
  // place in its shard's group (*open: it completed the group, whose
  // upstream the caller then opens; its accepting reply is queued, under
  // the group's lock, ahead of any answer). Relay: the worker's requests into the
  // group until its connection ends, then its leave.
  absl::Status Authenticate(Conn* conn, const proto::BnHello& hello,
                            bool* gone);
  absl::Status CheckUpstream(const proto::BnHello& hello) const;
  absl::StatusOr<std::shared_ptr<Group>> JoinGroup(const proto::BnHello& hello,
                                                   std::shared_ptr<Conn> conn,
                                                   bool* open);
  void Relay(const std::shared_ptr<Conn>& conn, int worker,
             const std::shared_ptr<Group>& g);
  // Opens `g`'s shard connection (on a thread the hello that completed it
  // starts), then starts its reader.
  void OpenUpstream(const std::shared_ptr<Group>& g);
  void ReadUpstream(std::shared_ptr<Group> g);
  // Fails `g` with `why` and forgets it.
  void Break(const std::shared_ptr<Group>& g, const absl::Status& why);
  // Runs `body` on a thread of its own (none once stopping), joining those
  // that have ended.
  void Spawn(std::function<void()> body) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::thread> TakeEndedThreads() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllThreadsEnded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  std::unique_ptr<security::TokenAuthenticator> auth_;
  util::LogLimiter refusal_log_;  // refused hellos' lines
  std::atomic<int64_t> refused_{0};
  int listen_fd_ = -1;
  int port_ = 0;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Every thread Spawn started and Stop (or a later Spawn) has not joined,
  // by id; ended_: those whose body has returned.
  std::map<int64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> ended_ ABSL_GUARDED_BY(mu_);
  int64_t next_thread_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // connections before their hello
  std::map<GroupKey, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  std::set<std::shared_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::hostbn

#endif  // BNPS_HOSTBN_AGGREGATOR_H_
