// One BN connection's requests, handed to the shard: BnDispatcher admits a
// BnRequest (Shard::Admit: the caller, the layer's shard, the connection's
// job generation), runs it on the shard's BnAggregator under the job's policy,
// and answers with a BnResponse -- at once, or once the barrier it waits on
// completes. A request of a worker that never registered with the shard is
// refused (FAILED_PRECONDITION), except BN_RUNNING, which only reads.
// Both BN transports use it: the gRPC BnSync stream
// (shard_reactors.h) and the raw-TCP BN listener (bn_socket_server.h).
//
// Answers are sized before the work: a request whose
// answer would exceed a message (proto::kMaxMessageBytes; e.g. a forward
// with want_running over about 260,000 channels) or what the transport's
// `admit` allows (a connection's unread-answer cap, the server's memory
// budget) is answered at once with RESOURCE_EXHAUSTED, and an answer that
// still comes out too large to frame becomes that error too: the worker
// always gets an answer it can report, never a silent close.
//
// Thread-safety: Dispatch is called by one thread at a time (a connection's
// reader); `send` may run on any thread.

#ifndef BNPS_SERVER_BN_DISPATCH_H_
#define BNPS_SERVER_BN_DISPATCH_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

#include "proto/bnps.pb.h"
#include "server/bn_aggregator.h"
#include "server/server_metrics.h"
#include "server/shard.h"
#include "util/byte_budget.h"

namespace bnps::server {

// Answers one BN connection (a raw-TCP connection or a BnSync stream) may
// leave unread before it is cut off; all of them together are held within
// the server's BN memory budget (ServerLimits::bn_memory_budget_bytes).
inline constexpr int64_t kMaxUnreadAnswerBytes = int64_t{64} << 20;

// Whether a connection that may leave `cap` bytes unread can hold an answer
// of `bytes` within `budget` now: RESOURCE_EXHAUSTED saying which is passed
// (BnDispatcher::Admit of both transports).
absl::Status CheckAnswerFits(int64_t bytes, int64_t cap,
                             const util::ByteBudget& budget);

class BnDispatcher {
 public:
  // Whether the transport can hold an answer of about `bytes`: OK, or the
  // error (RESOURCE_EXHAUSTED) the request is answered with instead.
  using Admit = std::function<absl::Status(int64_t bytes)>;

  // `shard` and `metrics` (may be null) are not owned and must outlive every
  // answer; `generation` is the connection's job generation; `caller` is the
  // worker the connection may act as (Shard::Admit; kAnyWorker: any);
  // `admit` (may be null: the message limit only) is called on Dispatch's
  // thread.
  BnDispatcher(Shard* shard, ServerMetrics* metrics, int64_t generation,
               int caller = Shard::kAnyWorker, Admit admit = nullptr);

  // An upper bound of the serialized size of an answer that carries
  // `arrays` float64 arrays of `channels` each (and a status message).
  static int64_t AnswerBytes(int arrays, int64_t channels);

  // Called exactly once per request with its answer (the request's id, a
  // non-zero code for an error), possibly before Dispatch returns and
  // possibly on another thread.
  using Send = std::function<void(const proto::BnResponse&)>;

  // `req` is not kept: Dispatch copies what it needs.
  void Dispatch(const proto::BnRequest& req, Send send);

 private:
  // The phases of Dispatch, in order.
  // The callback that counts the answer in the metrics, encodes it and
  // sends it.
  BnAggregator::Done MakeReply(const proto::BnRequest& req, Send send);
  // The caller (Shard::Admit) and the answer's size, before any work.
  absl::Status AdmitRequest(const proto::BnRequest& req);
  // The aggregator's call for the request's phase, answered through `reply`.
  void Route(const proto::BnRequest& req, const BnAggregator::Done& reply);

  // RESOURCE_EXHAUSTED if an answer of `arrays` arrays of `channels`
  // doubles could not be sent; else admit_'s verdict on its bytes.
  absl::Status AdmitAnswer(const proto::BnRequest& req, int arrays,
                           int64_t channels) const;

  Shard* const shard_;
  ServerMetrics* const metrics_;
  const int64_t generation_;
  const int caller_;
  const Admit admit_;
  ServerMetrics::LayerCache layer_cache_;  // the layers' metric series
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_BN_DISPATCH_H_
