// The export of a job's final state (a JobState, client/job_reader.h) as a
// safetensors file (util/safetensors.h) that a PyTorch module loads with
// load_state_dict(strict=True) when its modules are named as the job's keys.
//
// Names: a parameter key ending in ".w" or ".gamma" becomes "<prefix>.weight",
// one ending in ".b" or ".beta" "<prefix>.bias" (the built-in CNN's keys,
// nn/: "stem.conv.w" -> "stem.conv.weight"); any other key, e.g. a
// bnps.torch model's, which already has PyTorch's names, is kept. A BN layer
// L with running statistics gives L.running_mean and L.running_var
// (float32, as PyTorch's buffers; the servers keep float64, and the variance
// is the unbiased one, as PyTorch's) and L.num_batches_tracked (int64
// scalar: the job's step, the number of training steps that updated it).
// Parameters are float32. The metadata holds "format": "pt", "bnps_step" and
// "bnps_job_complete".
//
// Errors: INVALID_ARGUMENT when two keys map to one name; a write error
// naming the path.
// Thread-safety: functions only.

#ifndef BNPS_CLIENT_STATE_EXPORT_H_
#define BNPS_CLIENT_STATE_EXPORT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "client/job_reader.h"
#include "util/safetensors.h"

namespace bnps::client {

// The PyTorch name of parameter `key` (above).
std::string TorchParameterName(const std::string& key);

// The tensors of the export, by name.
absl::StatusOr<std::map<std::string, util::SafeTensor>> ExportTensors(
    const JobState& state);

// The safetensors bytes of the export.
absl::StatusOr<std::string> EncodeExport(const JobState& state);

// EncodeExport, written to `path` atomically.
absl::Status WriteExport(const JobState& state, const std::string& path);

}  // namespace bnps::client

#endif  // BNPS_CLIENT_STATE_EXPORT_H_
