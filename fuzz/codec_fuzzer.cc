// Fuzzes the decoders of every request and answer that carries values
// (proto/codec.h): arbitrary bytes are parsed as a BnRequest, a BnResponse
// and an InitParametersRequest, and whatever parses goes through the decoders
// the server and the client apply. A decoder may refuse anything; it must
// never crash, and what it accepts must be well formed.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "bn/moments.h"
#include "proto/bnps.pb.h"
#include "proto/codec.h"

namespace {

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "decoder accepted %s\n", what);
    std::abort();
  }
}

bool AllFinite(const std::vector<double>& v) {
  for (double x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

void DecodeStats(const bnps::proto::BnMoments& m,
                 const bnps::proto::BnSums& s,
                 const bnps::proto::BnRunningStats& r, int64_t channels) {
  absl::StatusOr<bnps::bn::Moments> moments =
      bnps::proto::DecodeMoments(m, channels);
  if (moments.ok()) {
    Require(bnps::bn::ValidateMoments(*moments).ok(), "invalid moments");
    Require(channels < 0 || moments->channels() == channels,
            "moments of another channel count");
  }
  absl::StatusOr<bnps::bn::BackwardSums> sums =
      bnps::proto::DecodeSums(s, channels);
  if (sums.ok()) {
    // (Any values: bn::BackwardSums may be non-finite.)
    Require(!sums->sum_dy.empty() &&
                sums->sum_dy.size() == sums->sum_dy_xhat.size() &&
                (channels < 0 ||
                 sums->sum_dy.size() == static_cast<size_t>(channels)),
            "malformed sums");
  }
  absl::StatusOr<bnps::bn::RunningStats> running =
      bnps::proto::DecodeRunning(r, channels);
  if (running.ok()) {
    Require(!running->mean.empty() &&
                running->mean.size() == running->var.size() &&
                AllFinite(running->mean) && AllFinite(running->var),
            "malformed running stats");
    for (double v : running->var) Require(v >= 0, "a negative variance");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  bnps::proto::BnRequest request;
  if (request.ParseFromString(bytes)) {
    DecodeStats(request.moments(), request.sums(), request.running(), -1);
  }
  bnps::proto::BnResponse response;
  if (response.ParseFromString(bytes)) {
    // The client decodes with the channel count it sent.
    const int64_t channels = 1 + static_cast<int64_t>(response.id() % 8);
    DecodeStats(response.moments(), response.sums(), response.running(),
                channels);
  }
  bnps::proto::InitParametersRequest init;
  if (init.ParseFromString(bytes)) {
    for (const bnps::proto::NamedTensor& t : init.parameters()) {
      absl::StatusOr<std::vector<float>> values =
          bnps::proto::DecodeFloat32(t.value());
      if (values.ok()) {
        for (float v : *values) Require(std::isfinite(v), "a non-finite float");
        const std::vector<int64_t> shape(t.value().shape().begin(),
                                         t.value().shape().end());
        absl::StatusOr<int64_t> n = bnps::proto::NumElements(shape);
        Require(n.ok() && *n == static_cast<int64_t>(values->size()),
                "a tensor whose size is not its shape's");
      }
    }
  }
  return 0;
}
