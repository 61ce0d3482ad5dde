// Test helpers for TensorReader and ChunkedMessageBuilder: a float ramp, a
// collector of the tensors a reader receives, and a PushGradientsRequest head.

#ifndef BNPS_PROTO_TENSOR_WIRE_TESTING_H_
#define BNPS_PROTO_TENSOR_WIRE_TESTING_H_

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/bnps.pb.h"
#include "proto/tensor_wire.h"

namespace bnps::proto {

inline std::vector<float> Ramp(int n, float scale = 0.5f) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = i * scale - 3;
  return v;
}

// Collects tensors as a TensorReader receives them.
struct Received {
  std::map<std::string, std::vector<float>> tensors;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::vector<std::string> completed;

  TensorReader Reader() {
    return TensorReader(
        [this](const std::string& key, absl::Span<const int64_t> shape,
               int64_t n) -> absl::StatusOr<float*> {
          shapes[key].assign(shape.begin(), shape.end());
          std::vector<float>& v = tensors[key];
          v.assign(n, NAN);
          return v.data();
        },
        [this](const std::string& key) {
          completed.push_back(key);
          return absl::OkStatus();
        });
  }
};

inline PushGradientsRequest Head() {
  PushGradientsRequest head;
  head.set_job("j");
  head.set_worker(3);
  head.set_step(17);
  head.set_num_samples(64);
  return head;
}

}  // namespace bnps::proto

#endif  // BNPS_PROTO_TENSOR_WIRE_TESTING_H_
