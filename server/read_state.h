// The answer of the read-only ReadState call (proto/bnps.proto): a shard's
// parameters and BN running statistics, cut into messages, from one
// consistent copy of its state. No network: the service streams what this
// builds, and tests check it directly.
//
// Thread-safety: thread-safe (the shard's own).

#ifndef BNPS_SERVER_READ_STATE_H_
#define BNPS_SERVER_READ_STATE_H_

#include <cstdint>
#include <vector>

#include "proto/bnps.pb.h"
#include "server/shard.h"

namespace bnps::server {

// The messages of a ReadState answer: parameters in key order, then the BN
// layers that have running statistics, in layer order; at least one
// message, each at most about `message_bytes` of payload (a chunk of a
// tensor never crosses a message). The first carries the step and whether
// the job is complete.
std::vector<proto::ReadStateResponse> ReadStateMessages(
    const Shard& shard, int64_t message_bytes);

// About how many bytes one copy of the shard's state takes in a ReadState
// answer (its parameters' values, their keys and framing, the BN running
// statistics), for charging the copies to the server's memory budget
// before they are made.
int64_t ReadStateBytes(const Shard& shard);

}  // namespace bnps::server

#endif  // BNPS_SERVER_READ_STATE_H_
