// BnBatchDispatcher: the requests of one raw-TCP BN connection that speaks
// for one worker or, from a host's BN aggregator (hostbn/aggregator.h), for
// several workers of one host. A plain request goes to the BnDispatcher
// of the worker it names; a batch (BnRequest.batch: one request of each of
// several workers) is handed out entry by entry, each to its worker's
// BnDispatcher exactly as if that worker had sent it on its own connection,
// and answered once, when every entry has its answer, by one BnResponse
// whose `batch` holds the entries' answers in the entries' order.
//
// Batching changes no result: the shard's barriers merge the contributions
// in worker order whatever order and grouping they arrive in (BnAggregator),
// so a batch gives the same bits as its entries sent one by one.
//
// Checks at this trust boundary: an entry (or plain request) naming a
// worker the connection does not speak for is refused by its dispatcher
// (PERMISSION_DENIED, as on a worker's own connection); an entry that is
// itself a batch is refused (INVALID_ARGUMENT); a batch with more entries
// than the connection has workers, or whose combined answer would not fit
// a message, is answered as a whole with an error (INVALID_ARGUMENT,
// RESOURCE_EXHAUSTED) and no entries.
//
// Thread-safety: Dispatch is called by one thread at a time (the
// connection's reader); `send` may run on any thread, once per request.

#ifndef BNPS_SERVER_BN_BATCH_DISPATCH_H_
#define BNPS_SERVER_BN_BATCH_DISPATCH_H_

#include <cstdint>
#include <map>
#include <vector>

#include "proto/bnps.pb.h"
#include "server/bn_dispatch.h"
#include "server/server_metrics.h"
#include "server/shard.h"

namespace bnps::server {

class BnBatchDispatcher {
 public:
  // As BnDispatcher's arguments, with `workers` (not empty) the workers the
  // connection speaks for: one BnDispatcher each, acting as that worker.
  BnBatchDispatcher(Shard* shard, ServerMetrics* metrics, int64_t generation,
                    const std::vector<int>& workers,
                    const BnDispatcher::Admit& admit = nullptr);

  // Answers `req` (a plain request or a batch) through `send`, exactly once.
  void Dispatch(const proto::BnRequest& req, BnDispatcher::Send send);

 private:
  BnDispatcher& For(int worker);

  std::map<int, BnDispatcher> by_worker_;  // not empty
};

}  // namespace bnps::server

#endif  // BNPS_SERVER_BN_BATCH_DISPATCH_H_
