// The gRPC client's BN traffic: BnCalls routes each BN call to the shard
// that owns its layer, over one of that shard's BnTransports
// (bn_transport.h): the long-lived BnSync stream (bn_stream.h; opened at
// first use, reopened after it breaks) or, where the shard offers BN over
// raw TCP (RegisterResponse.bn_port) and GrpcClientOptions::bn_over_tcp
// allows, its TCP connection (bn_socket.h): over the shard's Unix socket
// where it offers one (RegisterResponse.bn_unix_path, a listener of the
// same host) and GrpcClientOptions::bn_unix allows, else over TCP (a Unix
// socket that cannot be connected to, whose hello is refused, or that is
// another server's than the one registered with falls back to TCP at once). Internal to client/; the typed calls'
// contracts are PsClient's.
//
// A call's first attempt takes the TCP connection where there is one. A
// connection that cannot be made (or whose hello is refused: a port that
// now serves another job) leaves the shard on the stream for
// kBnSocketRetry; while one thread connects, the others' calls take the
// stream. Each change (connected, or failed and why) is said once on stderr.
//
// BnCall semantics: the request goes to the shard that owns the layer with a
// fresh id; the call blocks until the answer with that id arrives or
// CallTimeout() passes (DEADLINE_EXCEEDED). If the connection breaks while
// the call is in flight, it is repeated once on a fresh stream (the server
// deduplicates); a second break gives UNAVAILABLE. A stream the server ends
// with a definite error (PERMISSION_DENIED, INVALID_ARGUMENT, ...) fails its
// calls with that code, without a retry. An answer with a non-zero code
// becomes that status (proto::StatusFromWire); one whose statistics fail the
// checks of proto/codec.h is INVALID_ARGUMENT; bytes protobuf cannot parse as
// a BnResponse drop the connection (UNAVAILABLE, retried once as a break is).
//
// Thread-safety: thread-safe. The Channels must outlive it.

#ifndef BNPS_CLIENT_INTERNAL_BN_CALLS_H_
#define BNPS_CLIENT_INTERNAL_BN_CALLS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "client/internal/bn_transport.h"
#include "client/internal/channels.h"
#include "client/ps_client.h"
#include "proto/bnps.pb.h"

namespace bnps::client::internal {


// How long a shard whose BN connection failed stays on the stream before
// the next try.
inline constexpr absl::Duration kBnSocketRetry = absl::Seconds(30);

class BnCalls {
 public:
  explicit BnCalls(Channels* channels);
  // Close(), if not called yet.
  ~BnCalls();

  absl::StatusOr<BnForwardResult> BnForward(const std::string& layer,
                                            int64_t step,
                                            const bn::Moments& local,
                                            bool want_running);
  absl::StatusOr<bn::BackwardSums> BnBackward(const std::string& layer,
                                              int64_t step,
                                              const bn::BackwardSums& local);
  absl::Status BnRecal(const std::string& layer, int64_t batch,
                       const bn::Moments& moments);
  absl::StatusOr<bn::RunningStats> BnRecalFinish(const std::string& layer);
  absl::StatusOr<bn::RunningStats> BnLocalRunning(
      const std::string& layer, const bn::RunningStats& running);
  absl::StatusOr<bn::RunningStats> BnRunning(const std::string& layer,
                                             int64_t channels);

  // Cancels a stream whose write has been blocked past its caller's deadline
  // (a server that stopped reading: flow control would hold it forever).
  // The client's background thread calls it every 100 ms.
  void CancelStuckWrites(absl::Time now) ABSL_LOCKS_EXCLUDED(streams_mu_);

  // Fails every BN call with `why`, those under way included (this process
  // was dropped from the job: no answer can matter now, and a call to a
  // shard it cannot reach would wait out its deadline): ends the
  // connections at once, and later calls return `why` too. Idempotent; the
  // first `why` stays.
  void FailAll(const absl::Status& why) ABSL_LOCKS_EXCLUDED(streams_mu_);

  // Closes every connection (StartClose), gives the servers a moment (at most 1 s, or
  // rpc_timeout if shorter) to end them, then cancels what is left and
  // drains the streams. Calls still waiting fail with UNAVAILABLE, and later
  // calls too.
  void Close() ABSL_LOCKS_EXCLUDED(streams_mu_);

 private:
  // The current stream of `shard`, opened if there is none or it broke;
  // null once closed.
  std::shared_ptr<BnTransport> GetStream(int shard)
      ABSL_LOCKS_EXCLUDED(streams_mu_);
  // The raw-TCP connection of `shard`, opened if there is none or it broke;
  // null where the shard offers none, cannot be reached now (the stream
  // then carries its calls), another thread is connecting, or the client
  // is closed.
  std::shared_ptr<BnTransport> GetSocket(int shard)
      ABSL_LOCKS_EXCLUDED(streams_mu_);
  // One exchange as the file comment says. INVALID_ARGUMENT for an empty or
  // too long layer or a request larger than kMaxMessageBytes.
  // REQUIRES: request.phase() is set (the callers build it with BnHead).
  absl::StatusOr<proto::BnResponse> BnCall(proto::BnRequest request);
  // Every connection, taken out of the lists; no more are opened.
  std::vector<std::shared_ptr<BnTransport>> TakeTransportsLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(streams_mu_);
  // FailAll's `why`, or OK.
  absl::Status Failed() ABSL_LOCKS_EXCLUDED(streams_mu_);
  // BnCall for the phases answered with running stats (of `channels`
  // channels; -1: any number).
  absl::StatusOr<bn::RunningStats> BnCallForRunning(proto::BnRequest request,
                                                    int64_t channels);
  // INVALID_ARGUMENT for a malformed BN response, naming the shard of `layer`.
  absl::Status MalformedBn(const std::string& layer,
                           const absl::Status& s) const;

  Channels* const channels_;  // not owned
  std::atomic<uint64_t> next_bn_id_{1};

  absl::Mutex streams_mu_;
  std::vector<std::shared_ptr<BnTransport>> streams_ ABSL_GUARDED_BY(streams_mu_);
  std::vector<std::shared_ptr<BnTransport>> sockets_ ABSL_GUARDED_BY(streams_mu_);
  // Per shard: a thread is connecting; no connection is tried before
  // retry_at (after a failure); what was last said on stderr.
  struct SocketState {
    bool connecting = false;
    absl::Time retry_at = absl::InfinitePast();
    std::string said;
  };
  std::vector<SocketState> socket_state_ ABSL_GUARDED_BY(streams_mu_);
  bool closed_ ABSL_GUARDED_BY(streams_mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(streams_mu_);  // FailAll's `why`
};

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_BN_CALLS_H_
