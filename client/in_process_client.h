// A job's shards in this process, and a PsClient (client/ps_client.h) over
// them that calls the shards' plain classes (server/shard.h) directly: no
// sockets, no gRPC, no serialization. Tests run Trainers over it to check
// the training loop under every policy without server processes; the gRPC
// path has its own tests (client/grpc_ps_client_test.cc, tests/cluster_test).
//
// Like the gRPC service, InProcessPsClient routes each key to the shard that
// owns it, checks that the caller belongs to the job, and blocks on the
// shards' barriers until their callbacks answer. Every call also counts as a
// heartbeat. Arguments are not validated beyond what the shards check.
//
// Thread-safety: InProcessJob and InProcessPsClient are thread-safe; one
// client per worker thread is the intended use.

#ifndef BNPS_CLIENT_IN_PROCESS_CLIENT_H_
#define BNPS_CLIENT_IN_PROCESS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/ps_client.h"
#include "server/shard.h"

namespace bnps::test {

class InProcessJob {
 public:
  // `num_shards` shards with `options` (its shard and num_shards fields are
  // set for each). Errors as server::Shard::Create.
  static absl::StatusOr<std::unique_ptr<InProcessJob>> Create(
      server::ShardOptions options, int num_shards);

  int num_shards() const { return static_cast<int>(shards_.size()); }
  server::Shard& shard(int i) { return *shards_[i]; }
  // A fresh incarnation (server/membership.h) for each client: every Connect
  // stands for a process of its own, as GrpcPsClient's does.
  uint64_t NewIncarnation() { return next_incarnation_.fetch_add(1); }

 private:
  InProcessJob() = default;
  std::vector<std::unique_ptr<server::Shard>> shards_;
  std::atomic<uint64_t> next_incarnation_{1};
};

class InProcessPsClient final : public client::PsClient {
 public:
  // Registers `worker` with every shard of `job` (not owned; must outlive
  // the client) as a new incarnation. Errors as server::Shard::Register.
  static absl::StatusOr<std::unique_ptr<InProcessPsClient>> Connect(
      InProcessJob* job, int worker);

  const proto::JobConfig& config() const override { return config_; }
  int worker() const override { return worker_; }
  int num_workers() const override { return config_.num_workers(); }

  absl::Status InitParameters(const client::Params& params) override;
  absl::Status PushGradients(int64_t step, int64_t num_samples,
                             const client::Params& grads) override;
  absl::Status PushGradients(
      int64_t step, int64_t num_samples,
      std::shared_ptr<const client::Params> grads) override;
  // Pushes each part to the shards the moment it is added, so a step's keys
  // reach them in several pushes, during the backward pass, as over gRPC.
  std::unique_ptr<client::GradientPush> StartPush(
      int64_t step, int64_t num_samples) override;
  absl::Status PullParametersInto(int64_t min_version,
                                  client::Params* params) override;

  absl::StatusOr<client::BnForwardResult> BnForward(
      const std::string& layer, int64_t step, const bn::Moments& local,
      bool want_running = false) override;
  absl::StatusOr<bn::BackwardSums> BnBackward(
      const std::string& layer, int64_t step,
      const bn::BackwardSums& local) override;
  absl::Status BnRecal(const std::string& layer, int64_t batch,
                       const bn::Moments& moments) override;
  absl::StatusOr<bn::RunningStats> BnRecalFinish(
      const std::string& layer) override;
  absl::StatusOr<bn::RunningStats> BnLocalRunning(
      const std::string& layer, const bn::RunningStats& running) override;
  absl::StatusOr<bn::RunningStats> BnRunning(const std::string& layer,
                                             int64_t channels) override;

  absl::StatusOr<int64_t> StartStep(int64_t step) override;
  absl::Status FinishStep(int64_t completed) override;
  std::vector<int> LiveWorkers() const override;

 private:
  InProcessPsClient(InProcessJob* job, int worker, uint64_t incarnation,
                    proto::JobConfig config)
      : job_(job),
        worker_(worker),
        incarnation_(incarnation),
        config_(std::move(config)) {}

  // The shard that owns `key`, after a heartbeat from this worker to it.
  server::Shard& ShardOf(const std::string& key);
  // Runs a BN phase on the shard of `layer` and waits for its answer.
  absl::StatusOr<server::BnAggregator::Reply> Bn(
      const std::string& layer,
      const std::function<void(server::Shard&,
                               server::BnAggregator::Done)>& start);

  InProcessJob* const job_;
  const int worker_;
  const uint64_t incarnation_;  // as Register and Heartbeat need
  const proto::JobConfig config_;
};

}  // namespace bnps::test

#endif  // BNPS_CLIENT_IN_PROCESS_CLIENT_H_
