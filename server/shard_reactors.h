// The streaming calls of ShardService, as gRPC callback reactors: pushes
// (client stream of chunks), pulls (server stream of chunks), the BN
// stream (bidirectional) and the read-only ReadState (server stream). The service creates one per call, after it has
// authenticated the call; each deletes itself when the call is done.

#ifndef BNPS_SERVER_SHARD_REACTORS_H_
#define BNPS_SERVER_SHARD_REACTORS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "server/scratch_pool.h"
#include "server/server_metrics.h"
#include "server/shard.h"
#include "util/byte_budget.h"
#include "util/keep_awake.h"

namespace bnps::server {

// `metrics` may be null. `generation` is the job generation the call carries.
// `caller` is who the call's token proved the caller is (Shard::Admit):
// a worker's own token acts as that worker only.
grpc::ServerReadReactor<grpc::ByteBuffer>* NewPushReactor(
    Shard* shard, ScratchPool* scratch, grpc::ByteBuffer* resp,
    ServerMetrics* metrics, int64_t generation, int caller);
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewPullReactor(
    Shard* shard, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    ServerMetrics* metrics, int caller);
// Writes `messages` (serialized ReadStateResponses), then finishes OK;
// calls `done` (may be empty) once the call is over, however it ended.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewReadStateReactor(
    std::vector<grpc::ByteBuffer> messages, ServerMetrics* metrics,
    std::function<void()> done);
// `keep_awake` (may be null) is touched by every message of the stream.
// `stream` is the stream's admission (Shard::Admit with
// BnTransport::kStream): the reactor holds it until the stream is done;
// each request is admitted again as `caller`. Answers the
// client has not read are held within `budget` and kMaxUnreadAnswerBytes:
// past either, the stream answers no more (its client's calls time out) and
// gives back what it held.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewBnReactor(
    Shard* shard, ServerMetrics* metrics, int64_t generation,
    util::KeepAwake* keep_awake, int caller, Admission stream,
    std::shared_ptr<util::ByteBudget> budget);

}  // namespace bnps::server

#endif  // BNPS_SERVER_SHARD_REACTORS_H_
