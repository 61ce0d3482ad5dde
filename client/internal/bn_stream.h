// One shard's BnSync stream (bnps.proto) as a BnTransport (bn_transport.h):
// a long-lived bidirectional gRPC stream that carries every thread's BN
// calls to that shard, answers matched to calls by id. It has no thread of
// its own: callers poll it (see bn_stream.cc). The stream sends the job
// generation and (over TLS) the job token as metadata when it opens;
// without TLS the channel signs the opening (channel_auth.h); a server that
// refuses it ends it with a definite code (PERMISSION_DENIED, ...), which
// fails its calls without `retry`; a stream that breaks for any other reason
// fails them with `retry`. A write that flow control holds past its call's
// deadline cancels the stream. Internal to client/.

#ifndef BNPS_CLIENT_INTERNAL_BN_STREAM_H_
#define BNPS_CLIENT_INTERNAL_BN_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "client/internal/bn_transport.h"
#include "grpcpp/channel.h"

namespace bnps::client::internal {

// Opens (without blocking: the metadata leaves with the first call) a stream
// on `channel` for `generation`, sending `token` when it is not empty; a
// caller waiting for an answer polls `spin` before it blocks.
std::unique_ptr<BnTransport> OpenBnStream(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
    int64_t generation, absl::Duration spin);

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_BN_STREAM_H_
