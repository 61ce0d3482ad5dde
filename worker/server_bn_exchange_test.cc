#include "worker/server_bn_exchange.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/in_process_client.h"
#include "gtest/gtest.h"

namespace bnps::worker {
namespace {

server::ShardOptions SyncJob(int workers) {
  server::ShardOptions o;
  o.num_workers = workers;
  o.policy = policy::Policy::kSync;
  o.barrier_timeout = absl::Seconds(30);
  return o;
}

bn::Moments SomeMoments(double mean) {
  bn::Moments m = bn::Moments::Empty(2);
  m.count = 4;
  m.mean = {mean, -mean};
  m.m2 = {1.0, 2.0};
  return m;
}

// Two workers, each exchanging the backward sums of three layers a step for
// two steps through StartBackward: every call runs on the exchange's kept
// thread, one after another, and gives the sums over both workers, as
// Backward does; a pending exchange destroyed without Wait is waited for.
TEST(ServerBnExchangeTest, StartBackwardSumsOverTheWorkersCallAfterCall) {
  auto job = test::InProcessJob::Create(SyncJob(2), 1);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<std::string> layers = {"bn/0", "bn/1", "bn/2"};
  std::vector<std::vector<std::vector<double>>> got(2);
  std::vector<absl::Status> errors(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      auto client = test::InProcessPsClient::Connect(job->get(), w);
      if (!client.ok()) {
        errors[w] = client.status();
        return;
      }
      ServerBnExchange exchange(client->get(), policy::Policy::kSync);
      for (int64_t step = 0; step < 2; ++step) {
        exchange.set_step(step);
        for (const std::string& layer : layers) {
          absl::StatusOr<bn::Moments> m =
              exchange.Forward(layer, SomeMoments(w + 1.0));
          if (!m.ok()) {
            errors[w] = m.status();
            return;
          }
        }
        for (size_t i = layers.size(); i-- > 0;) {
          bn::BackwardSums local{{w + 1.0, 10.0 * (w + 1)},
                                 {static_cast<double>(i), step + 0.5}};
          std::unique_ptr<nn::PendingBackward> pending =
              exchange.StartBackward(layers[i], local);
          if (step == 1 && i == 0) continue;  // destroyed unwaited
          absl::StatusOr<bn::BackwardSums> sums = pending->Wait();
          if (!sums.ok()) {
            errors[w] = sums.status();
            return;
          }
          got[w].push_back(sums->sum_dy);
          got[w].push_back(sums->sum_dy_xhat);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(errors[w].ok()) << "worker " << w << ": " << errors[w];
    ASSERT_EQ(got[w].size(), 2u * 5);  // 6 exchanges, the last unwaited
    for (size_t k = 0; k < got[w].size(); k += 2) {
      const size_t i = 2 - (k / 2) % 3;  // layers in reverse
      const double step = k / 2 < 3 ? 0.5 : 1.5;
      EXPECT_EQ(got[w][k], (std::vector<double>{3.0, 30.0})) << k;
      EXPECT_EQ(got[w][k + 1], (std::vector<double>{2.0 * i, 2 * step}))
          << k;
    }
  }
}

}  // namespace
}  // namespace bnps::worker
