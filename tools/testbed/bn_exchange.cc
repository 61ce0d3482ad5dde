// bn_exchange: one worker of a BN-exchange benchmark on the test bed
// (bn_scaling.py). Registers with the job's servers as --worker and calls
// BnForward of one layer of --channels channels back to back, --reps times
// (each returns once every worker's contribution is in: the sync barrier);
// prints "p50_us=<..> p90_us=<..>" over the calls after --warmup.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bn/moments.h"
#include "client/grpc_ps_client.h"

ABSL_FLAG(std::string, servers, "", "Comma-separated server addresses.");
ABSL_FLAG(int, worker, 0, "This worker's id.");
ABSL_FLAG(int, num_workers, 1, "Workers in the job.");
ABSL_FLAG(int, channels, 64, "Channels of the BN layer.");
ABSL_FLAG(int, reps, 300, "Exchanges timed.");
ABSL_FLAG(int, warmup, 30, "Exchanges before the timed ones.");
ABSL_FLAG(int, bn_spin_us, 0, "As bnps_worker --bn_spin_us.");
ABSL_FLAG(std::string, bn_host_aggregator, "",
          "As bnps_worker --bn_host_aggregator.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  bnps::client::GrpcClientOptions o;
  o.servers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',');
  o.job = "bnps";
  o.worker = absl::GetFlag(FLAGS_worker);
  o.num_workers = absl::GetFlag(FLAGS_num_workers);
  o.rpc_timeout = absl::Seconds(60);
  o.bn_spin = absl::Microseconds(absl::GetFlag(FLAGS_bn_spin_us));
  o.bn_host_aggregator = absl::GetFlag(FLAGS_bn_host_aggregator);
  auto client = bnps::client::GrpcPsClient::Connect(std::move(o));
  if (!client.ok()) {
    std::fprintf(stderr, "bn_exchange: %s\n",
                 std::string(client.status().message()).c_str());
    return 1;
  }
  bnps::bn::Moments local;
  local.count = 32;
  for (int c = 0; c < absl::GetFlag(FLAGS_channels); ++c) {
    local.mean.push_back(0.01 * c + absl::GetFlag(FLAGS_worker));
    local.m2.push_back(1.0 + c);
  }
  std::vector<double> us;
  const int warmup = absl::GetFlag(FLAGS_warmup);
  for (int i = 0; i < warmup + absl::GetFlag(FLAGS_reps); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto result = (*client)->BnForward("bn/0", i, local);
    const double elapsed = std::chrono::duration<double, std::micro>(
                               std::chrono::steady_clock::now() - t0)
                               .count();
    if (!result.ok()) {
      std::fprintf(stderr, "bn_exchange: %s\n",
                   std::string(result.status().message()).c_str());
      return 1;
    }
    if (i >= warmup) us.push_back(elapsed);
  }
  std::sort(us.begin(), us.end());
  std::printf("p50_us=%.1f p90_us=%.1f\n", us[us.size() / 2],
              us[us.size() * 9 / 10]);
  return 0;
}
