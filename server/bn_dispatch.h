// One BN connection's requests, handed to the shard: BnDispatcher checks a
// BnRequest (the caller, the layer's shard, the connection's job
// generation), runs it on the shard's BnAggregator under the job's policy,
// and answers with a BnResponse -- at once, or once the barrier it waits on
// completes. Both BN transports use it: the gRPC BnSync stream
// (shard_reactors.h) and the raw-TCP BN listener (bn_socket_server.h).
//
// Thread-safety: Dispatch is called by one thread at a time (a connection's
// reader); `send` may run on any thread.

#ifndef BNPS_SERVER_BN_DISPATCH_H_
#define BNPS_SERVER_BN_DISPATCH_H_

#include <cstdint>
#include <functional>

#include "proto/bnps.pb.h"
#include "server/server_metrics.h"
#include "server/shard.h"

namespace bnps::server {

class BnDispatcher {
 public:
  // `shard` and `metrics` (may be null) are not owned and must outlive every
  // answer; `generation` is the connection's job generation.
  BnDispatcher(Shard* shard, ServerMetrics* metrics, int64_t generation);

  // Called exactly once per request with its answer (the request's id, a
  // non-zero code for an error), possibly before Dispatch returns and
  // possibly on another thread.
  using Send = std::function<void(const proto::BnResponse&)>;

  // `req` is not kept: Dispatch copies what it needs.
  void Dispatch(const proto::BnRequest& req, Send send);

 private:
  Shard* const shard_;
  ServerMetrics* const metrics_;
  const int64_t generation_;
  ServerMetrics::LayerCache layer_cache_;  // the layers' metric series
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_BN_DISPATCH_H_
