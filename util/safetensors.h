// The safetensors file format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON naming each
// tensor's dtype, shape and data_offsets (begin, end; relative to the end of
// the header), padded with spaces to a multiple of 8, then the tensors' raw
// little-endian bytes. PyTorch, JAX and NumPy read it with the safetensors
// package; python/bnps/export.py reads it without.
//
// Thread-safety: functions only, no state.

#ifndef BNPS_UTIL_SAFETENSORS_H_
#define BNPS_UTIL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace bnps::util {

struct SafeTensor {
  std::string dtype;            // "F32", "F64" or "I64"
  std::vector<int64_t> shape;   // [] for a scalar
  std::string data;             // product(shape) elements, little-endian
};

// The file's bytes: tensors laid out in name order, `metadata` (string
// values) as "__metadata__". INVALID_ARGUMENT for an unknown dtype, a
// negative dimension, data of the wrong size, or an empty or
// "__metadata__" name.
absl::StatusOr<std::string> EncodeSafetensors(
    const std::map<std::string, SafeTensor>& tensors,
    const std::map<std::string, std::string>& metadata = {});

// Writes `bytes` to `path` atomically: a temporary file beside it, fsync,
// rename. An error names the path.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& bytes);

}  // namespace bnps::util

#endif  // BNPS_UTIL_SAFETENSORS_H_
