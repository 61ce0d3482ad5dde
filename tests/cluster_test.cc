// A real job on 127.0.0.1: S shard servers (gRPC, ephemeral ports) and W
// worker threads, each with its own GrpcPsClient.
//
// - sync: BN through the servers equals whole-batch BN (outputs and dx), and
//   bulk-synchronous SGD equals one process on the concatenated batch, for
//   several steps (the central invariant of the project);
// - async: the staleness bound holds under random delays; with W = 1 it is
//   local BN;
// - recal: population statistics equal one process over the union of the data;
// - a retried push is not applied twice;
// - a worker that never comes, or goes silent, does not hang the others;
// - who may join: not a second process with a live worker's id, not a launch
//   whose config does not fit (and then nothing of it joined), and a lost
//   worker only if it never took part.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "bn/cpu_kernels.h"
#include "bn/reference.h"
#include "gtest/gtest.h"
#include "server/server_runner.h"
#include "client/grpc_ps_client.h"

namespace bnps {
namespace {

using client::Param;
using client::GrpcPsClient;

class Cluster {
 public:
  Cluster(int shards, server::ShardOptions base) {
    base.num_shards = shards;
    for (int s = 0; s < shards; ++s) {
      base.shard = s;
      auto r = server::RunningServer::Start(base, "127.0.0.1:0");
      EXPECT_TRUE(r.ok()) << r.status();
      addresses_.push_back("127.0.0.1:" + std::to_string((*r)->port()));
      servers_.push_back(*std::move(r));
    }
    workers_ = base.num_workers;
  }

  client::GrpcClientOptions ClientOptions(int worker) const {
    client::GrpcClientOptions o;
    o.servers = addresses_;
    o.job = "bnps";
    o.worker = worker;
    o.num_workers = workers_;
    o.rpc_timeout = absl::Seconds(20);
    o.heartbeat_interval = absl::Milliseconds(100);
    return o;
  }

  std::unique_ptr<GrpcPsClient> Connect(int worker) const {
    auto c = GrpcPsClient::Connect(ClientOptions(worker));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  server::RunningServer& server(int shard) { return *servers_[shard]; }

  // How every shard sees `worker` right now, as `client` asks.
  std::vector<proto::WorkerStatus> Worker(GrpcPsClient& client,
                                          int worker) const {
    std::vector<proto::WorkerStatus> out;
    for (int s = 0; s < static_cast<int>(servers_.size()); ++s) {
      absl::StatusOr<proto::StatusResponse> status = client.GetStatus(s);
      EXPECT_TRUE(status.ok()) << status.status();
      if (status.ok()) out.push_back(status->workers(worker));
    }
    return out;
  }

  // Waits (at most 10 s) until every shard counts `worker` as lost.
  bool AwaitLost(GrpcPsClient& client, int worker) const {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (absl::Now() < give_up) {
      bool lost = true;
      for (const proto::WorkerStatus& w : Worker(client, worker)) {
        lost = lost && w.registered() && !w.live();
      }
      if (lost) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<server::RunningServer>> servers_;
  std::vector<std::string> addresses_;
  int workers_ = 1;
};

// Runs fn(w) on W threads and joins them.
template <typename Fn>
void OnWorkers(int workers, Fn fn) {
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back([&fn, w] { fn(w); });
  for (auto& t : threads) t.join();
}

// --- sync: the central invariant --------------------------------------------

// A tiny model over an N x C input: y = BN(x; gamma, beta),
// out_i = sum_c v_c y_ic, loss = sum_i (out_i - t_i)^2 / 2. Parameters live on
// the servers; gradients are sums over samples.
constexpr int kChannels = 4;
const char kLayer[] = "bn/0";

struct StepData {
  std::vector<float> x;  // rows x kChannels
  std::vector<float> t;  // rows
};

StepData MakeStep(int rows, int step) {
  StepData d;
  const bn::Shape shape{rows, kChannels, 1, 1};
  d.x = bn::reference::RandomTensor(shape, 3.0, 2.0, 1000 + step, 1.5);
  d.t = bn::reference::RandomVector(rows, -1, 1, 2000 + step);
  return d;
}

struct StepOutput {
  std::vector<float> y, dx;
  std::map<std::string, Param> grads;
};

// One worker's step given the normalization moments and a function that turns
// local backward sums into the ones to use (identity for one process).
template <typename Reduce>
StepOutput ModelStep(const std::vector<float>& x, const std::vector<float>& t,
                     int rows, const std::map<std::string, Param>& params,
                     const bn::Moments& merged, Reduce reduce) {
  auto kernels = bn::NewCpuBnKernels();
  const bn::Shape shape{rows, kChannels, 1, 1};
  const std::vector<float>& gamma = params.at("param/gamma").values;
  const std::vector<float>& beta = params.at("param/beta").values;
  const std::vector<float>& v = params.at("param/v").values;
  const std::vector<double> var = bn::BiasedVariance(merged);
  const bn::Normalization norm{merged.mean, var, gamma, beta, 1e-5};
  StepOutput out;
  out.y.assign(x.size(), 0.0f);
  EXPECT_TRUE(kernels->Normalize(x.data(), shape, norm, out.y.data()).ok());
  std::vector<float> dy(x.size());
  std::vector<float> dv(kChannels, 0.0f);
  for (int i = 0; i < rows; ++i) {
    double o = 0;
    for (int c = 0; c < kChannels; ++c) o += v[c] * out.y[i * kChannels + c];
    const double r = o - t[i];
    for (int c = 0; c < kChannels; ++c) {
      dy[i * kChannels + c] = static_cast<float>(r * v[c]);
      dv[c] += static_cast<float>(r * out.y[i * kChannels + c]);
    }
  }
  absl::StatusOr<bn::BackwardSums> local =
      kernels->BackwardReduce(dy.data(), x.data(), shape, norm);
  EXPECT_TRUE(local.ok()) << local.status();
  const bn::BackwardSums global = reduce(*local);
  out.dx.assign(x.size(), 0.0f);
  EXPECT_TRUE(kernels
                  ->BackwardInput(dy.data(), x.data(), shape, norm, global,
                                  merged.count, out.dx.data())
                  .ok());
  std::vector<float> dgamma(local->sum_dy_xhat.begin(), local->sum_dy_xhat.end());
  std::vector<float> dbeta(local->sum_dy.begin(), local->sum_dy.end());
  out.grads["param/gamma"] = {{kChannels}, dgamma};
  out.grads["param/beta"] = {{kChannels}, dbeta};
  out.grads["param/v"] = {{kChannels}, dv};
  return out;
}

std::map<std::string, Param> InitialParams() {
  return {{"param/gamma", {{kChannels}, {1.0f, 0.8f, 1.2f, 1.1f}}},
          {"param/beta", {{kChannels}, {0.0f, 0.1f, -0.1f, 0.2f}}},
          {"param/v", {{kChannels}, {0.5f, -0.3f, 0.2f, 0.4f}}}};
}

double MaxRel(const std::vector<float>& got, const std::vector<float>& want) {
  return bn::reference::MaxRelativeError(
      got, std::vector<double>(want.begin(), want.end()), 1e-6);
}

TEST(ClusterTest, SyncEqualsOneProcessOnTheConcatenatedBatch) {
  const std::vector<int> rows = {5, 0, 8};  // uneven, one worker empty
  const int workers = rows.size(), total = 13, steps = 4;
  server::ShardOptions o;
  o.num_workers = workers;
  o.policy = policy::Policy::kSync;
  o.optimizer = {0.05, 0.9, 1e-3};
  o.barrier_timeout = absl::Seconds(20);
  Cluster cluster(2, o);

  // One process: the same model on the whole batch, with an in-process store.
  store::ParameterStore single({1, true, o.optimizer});
  for (const auto& [k, p] : InitialParams()) {
    ASSERT_TRUE(single.Init(k, p.shape, p.values).ok());
  }
  std::vector<StepOutput> want(steps);
  bn::RunningStats want_running = bn::RunningStats::Initial(kChannels);
  for (int s = 0; s < steps; ++s) {
    std::map<std::string, Param> params;
    single.Pull({}, 0, absl::InfiniteFuture(), [&](auto snap) {
      for (auto& [k, t] : *snap) params[k] = {t.shape, *t.values};
    });
    const StepData d = MakeStep(total, s);
    const bn::Moments m =
        *bn::NewCpuBnKernels()->ComputeMoments(d.x.data(), {total, kChannels, 1, 1});
    want[s] = ModelStep(d.x, d.t, total, params, m,
                        [](const bn::BackwardSums& l) { return l; });
    ASSERT_TRUE(bn::UpdateRunningStats(m, o.bn_momentum, &want_running).ok());
    for (const auto& [k, g] : want[s].grads) {
      ASSERT_TRUE(single.Push(0, s, k, g.shape, g.values, total).ok());
    }
  }
  std::map<std::string, Param> want_final;
  single.Pull({}, steps, absl::InfiniteFuture(), [&](auto snap) {
    for (auto& [k, t] : *snap) want_final[k] = {t.shape, *t.values};
  });

  // W workers through the servers.
  std::vector<std::vector<StepOutput>> got(workers, std::vector<StepOutput>(steps));
  std::vector<std::map<std::string, Param>> final_params(workers);
  std::vector<bn::RunningStats> final_running(workers);
  OnWorkers(workers, [&](int w) {
    std::unique_ptr<GrpcPsClient> client = cluster.Connect(w);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->InitParameters(InitialParams()).ok());
    const int begin = std::accumulate(rows.begin(), rows.begin() + w, 0);
    const bn::Shape whole{total, kChannels, 1, 1};
    // The worker's own running stats, updated as a BN layer does.
    bn::RunningStats own = bn::RunningStats::Initial(kChannels);
    for (int s = 0; s < steps; ++s) {
      absl::StatusOr<std::map<std::string, Param>> params = client->PullParameters(s);
      ASSERT_TRUE(params.ok()) << params.status();
      const StepData d = MakeStep(total, s);
      const std::vector<float> x =
          bn::reference::SliceBatch(d.x, whole, begin, begin + rows[w]);
      const std::vector<float> t(d.t.begin() + begin, d.t.begin() + begin + rows[w]);
      const bn::Moments local =
          *bn::NewCpuBnKernels()->ComputeMoments(x.data(), {rows[w], kChannels, 1, 1});
      // The servers' running stats come only when asked for (the last step).
      const bool last = s + 1 == steps;
      absl::StatusOr<client::BnForwardResult> fwd =
          client->BnForward(kLayer, s, local, /*want_running=*/last);
      ASSERT_TRUE(fwd.ok()) << fwd.status();
      EXPECT_EQ(fwd->contributors, workers);
      EXPECT_EQ(fwd->merged.count, total);
      ASSERT_TRUE(bn::UpdateRunningStats(fwd->merged, o.bn_momentum, &own).ok());
      ASSERT_EQ(fwd->running.has_value(), last);
      if (last) {  // the same bits as the servers'
        EXPECT_EQ(fwd->running->mean, own.mean);
        EXPECT_EQ(fwd->running->var, own.var);
      }
      got[w][s] = ModelStep(x, t, rows[w], *params, fwd->merged,
                            [&](const bn::BackwardSums& l) {
                              auto g = client->BnBackward(kLayer, s, l);
                              EXPECT_TRUE(g.ok()) << g.status();
                              return *g;
                            });
      ASSERT_TRUE(client->PushGradients(s, rows[w], got[w][s].grads).ok());
    }
    auto last = client->PullParameters(steps);
    ASSERT_TRUE(last.ok()) << last.status();
    final_params[w] = *std::move(last);
    absl::StatusOr<bn::RunningStats> running = client->BnRunning(kLayer, kChannels);
    ASSERT_TRUE(running.ok()) << running.status();
    final_running[w] = *std::move(running);
    EXPECT_EQ(client->BnRunning("bn/never-seen", kChannels).status().code(),
              absl::StatusCode::kNotFound);
  });

  for (int s = 0; s < steps; ++s) {
    std::vector<float> y, dx;
    for (int w = 0; w < workers; ++w) {
      y.insert(y.end(), got[w][s].y.begin(), got[w][s].y.end());
      dx.insert(dx.end(), got[w][s].dx.begin(), got[w][s].dx.end());
    }
    EXPECT_LT(MaxRel(y, want[s].y), 1e-5) << "step " << s;
    EXPECT_LT(MaxRel(dx, want[s].dx), 1e-5) << "step " << s;
  }
  for (int w = 0; w < workers; ++w) {
    for (const auto& [k, p] : want_final) {
      EXPECT_LT(MaxRel(final_params[w].at(k).values, p.values), 1e-5)
          << k << " worker " << w;
    }
  }
  // The servers' running stats are those of one process over the whole
  // batches (up to the merge's rounding), and the same for every worker.
  for (int w = 0; w < workers; ++w) {
    EXPECT_EQ(final_running[w].mean, final_running[0].mean) << "worker " << w;
    EXPECT_EQ(final_running[w].var, final_running[0].var) << "worker " << w;
    for (int c = 0; c < kChannels; ++c) {
      EXPECT_NEAR(final_running[w].mean[c], want_running.mean[c], 1e-9) << c;
      EXPECT_NEAR(final_running[w].var[c], want_running.var[c],
                  1e-9 * want_running.var[c]) << c;
    }
  }
  // The parameters moved: the test is not comparing two unchanged copies.
  EXPECT_GT(MaxRel(want_final.at("param/v").values, InitialParams()["param/v"].values),
            1e-3);
}

// --- async ------------------------------------------------------------------

TEST(ClusterTest, AsyncBoundHoldsUnderRandomDelays) {
  const int workers = 3, steps = 8;
  const int64_t staleness = 1;
  server::ShardOptions o;
  o.num_workers = workers;
  o.policy = policy::Policy::kAsync;
  o.staleness = staleness;
  o.barrier_timeout = absl::Seconds(20);
  Cluster cluster(2, o);

  absl::Mutex mu;
  std::vector<int64_t> completed(workers, 0);  // updated before the server hears
  int violations = 0, starts = 0;
  OnWorkers(workers, [&](int w) {
    std::unique_ptr<GrpcPsClient> client = cluster.Connect(w);
    ASSERT_NE(client, nullptr);
    std::mt19937 rng(w + 17);
    std::uniform_int_distribution<int> delay_ms(0, w == 2 ? 25 : 5);  // one slow
    const bn::Shape shape{4, 2, 3, 3};
    for (int c = 0; c < steps; ++c) {
      ASSERT_TRUE(client->StartStep(c).ok());
      {
        absl::MutexLock lock(&mu);
        ++starts;
        if (*std::min_element(completed.begin(), completed.end()) < c - staleness) {
          ++violations;
        }
      }
      const std::vector<float> x = bn::reference::RandomTensor(shape, w, 1, c * 10 + w);
      const bn::Moments local = *bn::NewCpuBnKernels()->ComputeMoments(x.data(), shape);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
      absl::StatusOr<client::BnForwardResult> fwd = client->BnForward(kLayer, c, local);
      ASSERT_TRUE(fwd.ok()) << fwd.status();
      EXPECT_LE(fwd->contributors, workers - 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
      {
        absl::MutexLock lock(&mu);
        completed[w] = c + 1;
      }
      ASSERT_TRUE(client->FinishStep(c + 1).ok());
    }
  });
  EXPECT_EQ(starts, workers * steps);
  EXPECT_EQ(violations, 0);
}

TEST(ClusterTest, AsyncWithOneWorkerIsLocal) {
  server::ShardOptions o;
  o.num_workers = 1;
  o.policy = policy::Policy::kAsync;
  o.staleness = 2;
  Cluster cluster(2, o);
  std::unique_ptr<GrpcPsClient> client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  const bn::Shape shape{6, 3, 2, 2};
  for (int c = 0; c < 3; ++c) {
    ASSERT_TRUE(client->StartStep(c).ok());
    const std::vector<float> x = bn::reference::RandomTensor(shape, 1, 2, c);
    const bn::Moments local = *bn::NewCpuBnKernels()->ComputeMoments(x.data(), shape);
    auto fwd = client->BnForward(kLayer, c, local);
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    // Nothing from others: merge(own, nothing) is the local batch's moments.
    EXPECT_EQ(fwd->merged.count, 0);
    EXPECT_EQ(fwd->contributors, 0);
    const bn::Moments used = *bn::MergeMoments({local, fwd->merged});
    EXPECT_EQ(used.mean, local.mean);
    EXPECT_EQ(used.m2, local.m2);
    ASSERT_TRUE(client->FinishStep(c + 1).ok());
  }
}

// --- recal ------------------------------------------------------------------

TEST(ClusterTest, RecalEqualsOneProcessOverTheUnion) {
  const int workers = 2;
  server::ShardOptions o;
  o.num_workers = workers;
  o.policy = policy::Policy::kRecal;
  Cluster cluster(2, o);
  const bn::Shape batch{5, 3, 4, 4};
  std::vector<std::vector<float>> data(workers);
  std::vector<bn::RunningStats> got(workers);
  OnWorkers(workers, [&](int w) {
    std::unique_ptr<GrpcPsClient> client = cluster.Connect(w);
    ASSERT_NE(client, nullptr);
    for (int b = 0; b < 2 + w; ++b) {  // uneven shards
      const std::vector<float> x =
          bn::reference::RandomTensor(batch, 500.0 + 3 * w, 1.0 + b, 50 * w + b, 1.0);
      data[w].insert(data[w].end(), x.begin(), x.end());
      ASSERT_TRUE(client
                      ->BnRecal(kLayer, b,
                                *bn::NewCpuBnKernels()->ComputeMoments(x.data(), batch))
                      .ok());
    }
    auto r = client->BnRecalFinish(kLayer);
    ASSERT_TRUE(r.ok()) << r.status();
    got[w] = *r;
  });
  std::vector<float> all = data[0];
  all.insert(all.end(), data[1].begin(), data[1].end());
  const bn::Shape union_shape{batch.n * 5, 3, 4, 4};
  const bn::reference::Stats want = bn::reference::ComputeStats(all, union_shape);
  for (int w = 0; w < workers; ++w) {
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(got[w].mean[c], want.mean[c], 1e-6 * std::fabs(want.mean[c]));
      const double unbiased = want.m2[c] / (want.count - 1);
      EXPECT_NEAR(got[w].var[c], unbiased, 1e-6 * unbiased);
    }
  }
}

// --- exactly once -----------------------------------------------------------

TEST(ClusterTest, RetriedPushIsNotAppliedTwice) {
  server::ShardOptions o;
  o.num_workers = 1;
  o.optimizer = {0.5, 0.0, 0.0};
  Cluster cluster(2, o);
  std::unique_ptr<GrpcPsClient> client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->InitParameters(InitialParams()).ok());
  std::map<std::string, Param> grads = {
      {"param/v", {{kChannels}, {2.0f, 2.0f, 2.0f, 2.0f}}}};
  ASSERT_TRUE(client->PushGradients(0, 2, grads).ok());
  ASSERT_TRUE(client->PushGradients(0, 2, grads).ok());  // the retry
  auto params = client->PullParameters({"param/v"}, 1);
  ASSERT_TRUE(params.ok()) << params.status();
  const std::vector<float> v0 = InitialParams()["param/v"].values;
  for (int c = 0; c < kChannels; ++c) {
    EXPECT_FLOAT_EQ(params->at("param/v").values[c], v0[c] - 0.5f * 1.0f);
  }
  int64_t duplicates = 0;
  for (int s = 0; s < client->num_shards(); ++s) {
    duplicates += client->GetStatus(s)->pushes_duplicate();
  }
  EXPECT_EQ(duplicates, 1);
}

// --- a worker that disappears ------------------------------------------------

bn::Moments SomeMoments() {
  const bn::Shape shape{3, 2, 2, 2};
  const std::vector<float> x = bn::reference::RandomTensor(shape, 0, 1, 3);
  return *bn::NewCpuBnKernels()->ComputeMoments(x.data(), shape);
}

// --- what the servers report -------------------------------------------------

// GetStatus and the metrics see the real calls: per-worker steps and pushes,
// the BN layer's barrier waits, and async staleness.
TEST(ClusterTest, StatusAndMetricsFollowTheCalls) {
  server::ShardOptions o;
  o.num_workers = 2;
  o.policy = policy::Policy::kAsync;
  o.staleness = 3;
  Cluster cluster(1, o);
  std::unique_ptr<GrpcPsClient> a = cluster.Connect(0);
  std::unique_ptr<GrpcPsClient> b = cluster.Connect(1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->InitParameters(InitialParams()).ok());
  // Worker 1 runs steps 0 and 1, worker 0 then step 2: merged with worker
  // 1's moments of step 1, one step old.
  for (int c = 0; c < 2; ++c) {
    ASSERT_TRUE(b->StartStep(c).ok());
    ASSERT_TRUE(b->BnForward(kLayer, c, SomeMoments()).ok());
    ASSERT_TRUE(b->PushGradients(c, 2, {{"param/v", {{kChannels}, {1, 1, 1, 1}}}})
                    .ok());
    ASSERT_TRUE(b->FinishStep(c + 1).ok());
  }
  ASSERT_TRUE(a->StartStep(2).ok());
  absl::StatusOr<client::BnForwardResult> fwd =
      a->BnForward(kLayer, 2, SomeMoments());
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->contributors, 1);

  absl::StatusOr<proto::StatusResponse> status = a->GetStatus(0);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->workers_size(), 2);
  EXPECT_EQ(status->workers(0).step(), 2);
  EXPECT_EQ(status->workers(0).pushes(), 0);
  EXPECT_EQ(status->workers(1).step(), 1);
  EXPECT_EQ(status->workers(1).pushes(), 2);
  ASSERT_EQ(status->bn_layers_size(), 1);
  EXPECT_EQ(status->bn_layers(0).layer(), kLayer);
  EXPECT_EQ(status->bn_layers(0).phase(), proto::BN_FORWARD);
  EXPECT_EQ(status->bn_layers(0).messages(), 3);
  EXPECT_EQ(status->bn_layers(0).step(), 2);
  EXPECT_GT(status->bn_layers(0).slowest_wait_seconds(), 0);

  const std::string text = cluster.server(0).registry().TextExposition();
  EXPECT_NE(text.find("bnps_server_pushes_total{result=\"applied\"} 2\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("bnps_server_bn_barrier_wait_seconds_count{layer=\"" +
                      std::string(kLayer) + "\",phase=\"forward\"} 3\n"),
            std::string::npos) << text;
  // Worker 0's step 2 merged worker 1's step 1 (staleness 1); worker 1's
  // step 1 merged nothing of worker 0 (it had sent none).
  EXPECT_NE(text.find("bnps_server_bn_staleness_steps_bucket{le=\"0\"} 0\n"
                      "bnps_server_bn_staleness_steps_bucket{le=\"1\"} 1\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("bnps_server_requests_total{method=\"StartStep\",code="
                      "\"OK\"} 3\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("bnps_server_worker_step{worker=\"1\"} 1\n"),
            std::string::npos) << text;
}

TEST(ClusterTest, AbsentWorkerFailsTheBarrierAtItsDeadline) {
  server::ShardOptions o;
  o.num_workers = 2;
  o.barrier_timeout = absl::Milliseconds(1500);
  Cluster cluster(1, o);
  std::unique_ptr<GrpcPsClient> client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  auto fwd = client->BnForward(kLayer, 0, SomeMoments());
  EXPECT_EQ(fwd.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(fwd.status().message().find("workers [1]"), std::string::npos)
      << fwd.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

void LoseWorkerOne(policy::WorkerLoss loss) {
  server::ShardOptions o;
  o.num_workers = 2;
  o.barrier_timeout = absl::Seconds(60);  // the heartbeat must end it first
  o.heartbeat_timeout = absl::Seconds(2);
  o.worker_loss = loss;
  Cluster cluster(2, o);
  std::unique_ptr<GrpcPsClient> survivor = cluster.Connect(0);
  std::unique_ptr<GrpcPsClient> doomed = cluster.Connect(1);
  ASSERT_NE(survivor, nullptr);
  ASSERT_NE(doomed, nullptr);
  doomed.reset();  // goes silent mid-job
  const absl::Time start = absl::Now();
  auto fwd = survivor->BnForward(kLayer, 0, SomeMoments());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  if (loss == policy::WorkerLoss::kFail) {
    EXPECT_EQ(fwd.status().code(), absl::StatusCode::kFailedPrecondition)
        << fwd.status();
    EXPECT_NE(fwd.status().message().find("worker 1 was lost"), std::string::npos)
        << fwd.status();
  } else {
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    EXPECT_EQ(fwd->contributors, 1);
  }
}

TEST(ClusterTest, SilentWorkerFailsTheJobClearly) {
  LoseWorkerOne(policy::WorkerLoss::kFail);
}

TEST(ClusterTest, SilentWorkerIsDroppedUnderShrink) {
  LoseWorkerOne(policy::WorkerLoss::kShrink);
}

// --- who may join ------------------------------------------------------------

TEST(ClusterTest, SameWorkerLaunchedTwiceIsRefusedWhileTheFirstIsLive) {
  server::ShardOptions o;
  o.num_workers = 1;
  Cluster cluster(2, o);
  std::unique_ptr<GrpcPsClient> first = cluster.Connect(0);
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> second =
      GrpcPsClient::Connect(cluster.ClientOptions(0));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition)
      << second.status();
  EXPECT_NE(second.status().message().find("worker 0 is already registered"),
            std::string::npos)
      << second.status();
  // The first goes on undisturbed.
  ASSERT_TRUE(first->InitParameters(InitialParams()).ok());
  std::map<std::string, Param> grads = {
      {"param/v", {{kChannels}, {2.0f, 2.0f, 2.0f, 2.0f}}}};
  ASSERT_TRUE(first->PushGradients(0, 2, grads).ok());
  EXPECT_TRUE(first->PullParameters({"param/v"}, 1).ok());
  EXPECT_TRUE(first->heartbeat_stats().dropped.ok());
}

TEST(ClusterTest, ABadLaunchJoinsNothingAndItsRelaunchIsWelcome) {
  server::ShardOptions o;
  o.num_workers = 2;
  o.heartbeat_timeout = absl::Seconds(2);
  o.barrier_timeout = absl::Seconds(20);
  Cluster cluster(3, o);
  std::unique_ptr<GrpcPsClient> other = cluster.Connect(0);
  ASSERT_NE(other, nullptr);
  // Launched with the servers out of order, or with a flag the job does not
  // have: refused before it joins any shard.
  client::GrpcClientOptions swapped = cluster.ClientOptions(1);
  std::swap(swapped.servers[1], swapped.servers[2]);
  client::GrpcClientOptions wrong_policy = cluster.ClientOptions(1);
  wrong_policy.check_config = [](const proto::JobConfig& c) {
    return c.policy() == proto::POLICY_ASYNC
               ? absl::OkStatus()
               : absl::FailedPreconditionError("--policy=async");
  };
  for (const client::GrpcClientOptions& bad : {swapped, wrong_policy}) {
    absl::StatusOr<std::unique_ptr<GrpcPsClient>> refused =
        GrpcPsClient::Connect(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
        << refused.status();
  }
  for (const proto::WorkerStatus& w : cluster.Worker(*other, 1)) {
    EXPECT_FALSE(w.registered());
  }
  // The corrected launch joins at once (a bad launch that had registered
  // would still be live, and refuse it) and trains.
  std::unique_ptr<GrpcPsClient> fixed = cluster.Connect(1);
  ASSERT_NE(fixed, nullptr);
  std::thread t([&] {
    auto fwd = fixed->BnForward(kLayer, 0, SomeMoments());
    EXPECT_TRUE(fwd.ok()) << fwd.status();
  });
  auto fwd = other->BnForward(kLayer, 0, SomeMoments());
  t.join();
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->contributors, 2);
}

TEST(ClusterTest, LostWorkerThatNeverTookPartRejoins) {
  server::ShardOptions o;
  o.num_workers = 2;
  o.heartbeat_timeout = absl::Seconds(2);
  o.barrier_timeout = absl::Seconds(20);
  Cluster cluster(2, o);
  std::unique_ptr<GrpcPsClient> other = cluster.Connect(0);
  ASSERT_NE(other, nullptr);
  std::unique_ptr<GrpcPsClient> crashed = cluster.Connect(1);
  ASSERT_NE(crashed, nullptr);
  crashed.reset();  // dies before its first step
  ASSERT_TRUE(cluster.AwaitLost(*other, 1));
  std::unique_ptr<GrpcPsClient> relaunched = cluster.Connect(1);
  ASSERT_NE(relaunched, nullptr);
  for (const proto::WorkerStatus& w : cluster.Worker(*other, 1)) {
    EXPECT_TRUE(w.live());
  }
  std::thread t([&] {
    auto fwd = relaunched->BnForward(kLayer, 0, SomeMoments());
    EXPECT_TRUE(fwd.ok()) << fwd.status();
  });
  auto fwd = other->BnForward(kLayer, 0, SomeMoments());
  t.join();
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->contributors, 2);

  // Having taken part, it does not come back once lost.
  relaunched.reset();
  ASSERT_TRUE(cluster.AwaitLost(*other, 1));
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> again =
      GrpcPsClient::Connect(cluster.ClientOptions(1));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("after it took part in the job"),
            std::string::npos)
      << again.status();
}

}  // namespace
}  // namespace bnps
