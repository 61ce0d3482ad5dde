// The star barrier: the server side of the echo service's Gather method
// (echo.proto), the "star" peer of the BN latency table. Each of W streams
// sends a message with group = W; none is answered until all W have sent
// theirs, and then all are answered with their own message. It is the floor
// under any barrier served over gRPC: bnps's BN barrier minus its work.
//
// Thread-safety: GatherHall is thread-safe; a GatherReactor is driven by
// gRPC's callbacks and the hall.

#ifndef BNPS_BENCH_STAR_BARRIER_H_
#define BNPS_BENCH_STAR_BARRIER_H_

#include <algorithm>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "bench/echo.grpc.pb.h"

namespace bnps::bench {

class GatherReactor;

// The groups of Gather streams waiting for their last member. A group is
// keyed by its size; the benchmark runs one group of each size at a time.
class GatherHall {
 public:
  // Holds `r` until its group is complete, then answers every member. False
  // if `r` was cancelled first: the caller finishes it.
  bool Arrive(GatherReactor* r);
  // From OnCancel: true if `r` was waiting (it no longer is; the caller
  // finishes it). Otherwise marks it, and Arrive will refuse it.
  bool Leave(GatherReactor* r);

 private:
  absl::Mutex mu_;
  std::map<int, std::vector<GatherReactor*>> waiting_ ABSL_GUARDED_BY(mu_);
};

// One Gather stream. Deletes itself when gRPC is done with it.
class GatherReactor : public grpc::ServerBidiReactor<Blob, Blob> {
 public:
  // `hall` is not owned and must outlive the stream.
  explicit GatherReactor(GatherHall* hall) : hall_(hall) { StartRead(&blob_); }
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  // A cancelled call with no operation pending must still be finished.
  void OnCancel() override;
  void OnDone() override { delete this; }

  // Sends back the message just read (the group is complete).
  void Answer() { StartWrite(&blob_); }
  // The size of this stream's group, as its last message said.
  int group() const { return std::max(1, blob_.group()); }

 private:
  friend class GatherHall;
  GatherHall* const hall_;
  Blob blob_;
  bool cancelled_ = false;  // guarded by the hall's mu_
};

}  // namespace bnps::bench

#endif  // BNPS_BENCH_STAR_BARRIER_H_
