// The gRPC client's ParameterPull (client/ps_client.h): one in_order
// PullParameters call per shard that owns some of the keys, all at once,
// each on that shard's long-lived thread (task_threads.h). The server sends a shard's keys in the
// order asked, each as soon as it has the version; a tensor is read straight
// into the caller's entry and its key marked in once its last chunk is
// written. A failed call is retried as BulkTransfer's pulls are, asking
// only for the keys not yet in (so no buffer a caller may be reading is
// written again). A server that predates in_order sends the shard's keys
// all at once; that works too, without the overlap. Internal to client/.
//
// Thread-safety: as ParameterPull's. The Channels and the TaskThreads must
// outlive the pull.

#ifndef BNPS_CLIENT_INTERNAL_STREAMING_PULL_H_
#define BNPS_CLIENT_INTERNAL_STREAMING_PULL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/internal/channels.h"
#include "client/internal/task_threads.h"
#include "client/ps_client.h"
#include "grpcpp/client_context.h"

namespace bnps::client::internal {

class StreamingPull final : public ParameterPull {
 public:
  // Starts pulling `keys` at `min_version` into `*into` (not owned; see
  // PsClient::StartPull). If `refused` is not OK nothing is sent and every
  // Wait and Finish return it.
  // `threads` (not owned) has a thread per shard.
  StreamingPull(Channels* channels, TaskThreads* threads, int64_t min_version,
                const std::vector<std::string>& keys, Params* into,
                absl::Status refused = absl::OkStatus());
  // Cancels the calls in flight and waits for them.
  ~StreamingPull() override;

  absl::Status Wait(const std::string& key) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Finish() override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Key {
    int shard = 0;
    Param* param = nullptr;  // the caller's entry
    bool in = false;  // ABSL_GUARDED_BY(mu_)
  };
  struct ShardCall {
    std::vector<std::string> keys;  // in the order asked
    bool ended = false;            // ABSL_GUARDED_BY(mu_)
    absl::Status status;           // ABSL_GUARDED_BY(mu_); how it ended
    grpc::ClientContext* context = nullptr;  // ABSL_GUARDED_BY(mu_)
  };

  // Pulls shard `shard`'s keys, with retries; runs on its own thread.
  void Run(int shard) ABSL_LOCKS_EXCLUDED(mu_);
  // One attempt for the keys not in yet, on `context` (Channels::WithRetries
  // set it up).
  absl::Status Attempt(int shard, grpc::ClientContext& context)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The status of `key` now: OK if in, its shard's error if that ended
  // without it, nullopt while it may still come.
  std::optional<absl::Status> KeyStatus(const Key& k) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Channels* const channels_;  // not owned
  const int64_t min_version_;
  const absl::Status refused_;
  std::vector<std::string> order_;  // the keys as asked

  mutable absl::Mutex mu_;
  std::map<std::string, Key> keys_;  // set up before the threads start
  std::vector<ShardCall> shards_;    // by shard id; same
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // One per call handed to a thread, notified once the call is over and no
  // longer touches the pull.
  std::vector<std::shared_ptr<absl::Notification>> calls_done_;
  // Waits until every call is over.
  void AwaitCalls();
};

}  // namespace bnps::client::internal

#endif  // BNPS_CLIENT_INTERNAL_STREAMING_PULL_H_
