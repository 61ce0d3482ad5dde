// Batcher: what a host's BN aggregator (hostbn/aggregator.h) does with the
// requests of the k workers it serves for one shard, without the sockets.
// The barrier requests (BN_FORWARD, BN_BACKWARD, BN_RECAL_FINISH,
// BN_LOCAL_RUNNING) of one (layer, phase, step) are held until each of the
// k workers has sent its own, then leave as ONE batch (BnRequest.batch, in
// worker order); the rest (BN_RECAL, BN_RUNNING, which answer at once, and
// a worker's repeat of a request already sent) leave at once as a batch of
// one. The shard answers a batch with one BnResponse whose `batch` holds
// the entries' answers; Answer hands each to its worker.
//
// Bitwise identity: the shard merges a barrier's contributions in worker
// order however they arrive (server/bn_aggregator.h), so a batch gives the
// bits the k requests sent one by one give; the host merges nothing.
//
// A worker whose connection closed (Leave) holds up no round until it says
// hello again (Join): the rounds that waited only for it leave without it,
// and so do later ones. The shard then waits for its contribution (which it
// may repeat on another connection, e.g. the gRPC stream) or fails the
// barrier naming it, exactly as when every worker sends its own.
//
// Errors: past kMaxHeldRounds a new round is refused (RESOURCE_EXHAUSTED);
// Fail answers every held and outstanding request with its status (the
// shard's connection broke).
//
// Thread-safety: not thread-safe; the aggregator serializes calls.

#ifndef BNPS_HOSTBN_BATCHER_H_
#define BNPS_HOSTBN_BATCHER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/bnps.pb.h"

namespace bnps::hostbn {

class Batcher {
 public:
  // Rounds held at most: a request that would open one more is refused
  // (RESOURCE_EXHAUSTED), so that a worker cannot fill the host's memory
  // with rounds its peers never join.
  static constexpr int kMaxHeldRounds = 1024;

  // What a call gives the aggregator to do.
  struct Out {
    std::vector<proto::BnRequest> upstream;  // frames for the shard
    // Answers for workers now (errors): (worker, answer).
    std::vector<std::pair<int, proto::BnResponse>> answers;
  };

  // `workers`: how many workers of the host it serves (k >= 1).
  explicit Batcher(int workers);

  // Worker `worker` said hello (again).
  void Join(int worker);
  // Worker `worker`'s request.
  Out Submit(int worker, proto::BnRequest req);
  // Worker `worker`'s connection closed.
  Out Leave(int worker);
  // The shard's answer to a frame of `upstream`: (worker, answer) for each
  // entry; none for an id it did not send (or answered already).
  std::vector<std::pair<int, proto::BnResponse>> Answer(
      const proto::BnResponse& resp);
  // Every held and outstanding request is answered with `why`.
  Out Fail(const absl::Status& why);

  // Rounds held, waiting for workers (for tests).
  int held() const { return static_cast<int>(held_.size()); }

 private:
  using Key = std::tuple<std::string, int, int64_t>;  // layer, phase, step
  struct Entry {
    int worker;
    uint64_t id;
  };

  proto::BnRequest Frame(std::vector<std::pair<int, proto::BnRequest>> reqs);
  static proto::BnResponse Error(uint64_t id, const absl::Status& s);
  // Whether every worker that has not gone contributed to `round`.
  bool Complete(const std::map<int, proto::BnRequest>& round) const;
  // `round`'s frame, remembering `key` as sent.
  proto::BnRequest Send(const Key& key, std::map<int, proto::BnRequest> round);

  const int workers_;
  uint64_t next_id_ = 1;
  std::map<Key, std::map<int, proto::BnRequest>> held_;  // by worker
  std::map<uint64_t, std::vector<Entry>> outstanding_;   // by frame id
  // Rounds sent, the newest last (a bounded memory), for repeats.
  std::set<Key> sent_;
  std::deque<Key> sent_order_;
  std::set<int> gone_;  // connections closed, no hello since
};

}  // namespace bnps::hostbn

#endif  // BNPS_HOSTBN_BATCHER_H_
