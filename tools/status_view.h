// What bnps_status prints: the shards' StatusResponses as text for an
// 80-column terminal (one-shot or --watch), or as one JSON document.
//
// Thread-safety: plain functions of their arguments.

#ifndef BNPS_TOOLS_STATUS_VIEW_H_
#define BNPS_TOOLS_STATUS_VIEW_H_

#include <optional>
#include <string>
#include <vector>

#include "proto/bnps.pb.h"

namespace bnps::tools {

// One server's answer, or why there is none.
struct ShardAnswer {
  std::string address;
  std::optional<proto::StatusResponse> status;  // absent: unreachable
  std::string error;                            // why, when absent
};

struct ViewOptions {
  // BN layers shown per shard, slowest first (the rest are counted).
  // Default: 8.
  int max_layers = 8;
};

// The text view: per shard, the job, parameters and pushes, each worker's
// state, step, pushes and last heartbeat, and the BN layers whose newest
// step waited longest. Lines fit in 80 columns (long layer names are cut).
std::string FormatText(const std::vector<ShardAnswer>& answers,
                       const ViewOptions& options = {});

// {"servers": [{"address": ..., "status": <StatusResponse as protobuf's
// JSON mapping>} or {"address": ..., "error": ...}, ...]}.
std::string FormatJson(const std::vector<ShardAnswer>& answers);

}  // namespace bnps::tools

#endif  // BNPS_TOOLS_STATUS_VIEW_H_
