// The parameters of one training step, pulled layer by layer
// (TrainerOptions::layer_pull): the step's pull starts before the forward
// pass, asking for the model's parameters in model order
// (client::PsClient::StartPull), and each model's forward pass waits for a
// layer's parameters just before that layer runs
// (nn::Model::ParametersNeeded). So the first layers compute while the later
// layers' parameters are still on their way -- or still being updated on
// the servers, which apply the last layers' gradients first. Every model (the
// first and the replicas) takes the values from the same buffers, which the
// pull reuses step after step. The results are those of a whole pull before
// the pass, bit for bit: the same values reach the same layers.
//
// Errors: a failed Wait ends the model's pass with the pull's status
// (DEADLINE_EXCEEDED, FAILED_PRECONDITION, ABORTED on a rollback, ...);
// error() keeps the first, so the trainer can report it as a pull error.
//
// Thread-safety: Start, Finish and Stop from one thread; the hooks from any
// number of threads (one per model) between Start and Finish or Stop.

#ifndef BNPS_WORKER_LAYER_PULL_H_
#define BNPS_WORKER_LAYER_PULL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "nn/model.h"

namespace bnps::worker {

class LayerPull {
 public:
  // Pulls through `client` (not owned) the parameters of `model` (read
  // once, for their names in model order).
  LayerPull(client::PsClient* client, const nn::Model& model);
  ~LayerPull();  // Stop()

  // Starts pulling the parameters at `min_version`.
  void Start(int64_t min_version);
  // The hook for model `m`'s Forward: waits for each parameter and sets it
  // in `m`. With `waited` (not owned), adds the time spent waiting to it
  // (for one thread only).
  nn::Model::ParametersNeeded Hook(nn::Model* m, absl::Duration* waited);
  // Waits for the whole pull; the first error, or OK.
  absl::Status Finish();
  // Drops the pull (cancelling what is in flight); for a step that failed.
  void Stop();
  // The first error a hook got from the pull (OK if none).
  absl::Status error() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  client::PsClient* const client_;  // not owned
  const std::vector<std::string> order_;
  client::Params buffers_;  // written by the pull, read after Wait
  std::unique_ptr<client::ParameterPull> pull_;

  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bnps::worker

#endif  // BNPS_WORKER_LAYER_PULL_H_
