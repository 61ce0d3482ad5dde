// The bnps side of the benchmark: a worker's PsClient options, and the bnps
// row of the BN latency table. A row is one sync-policy shard server in the
// benchmark's process and W workers in the pool's processes, each with its
// own PsClient calling BnForward(layer, step, moments) back to back; each call
// returns after the server's barrier.
//
// Thread-safety: plain functions.

#ifndef BNPS_BENCH_BNPS_PEER_H_
#define BNPS_BENCH_BNPS_PEER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/latency_job.h"
#include "bench/settings.h"
#include "bench/timing.h"
#include "bench/worker_pool.h"
#include "client/grpc_ps_client.h"

namespace bnps::bench {

// Options for worker `worker` of `workers` in job "bnps": plaintext, no
// token, a 30 s rpc_timeout.
client::GrpcClientOptions ClientOptions(std::vector<std::string> servers,
                                      int worker, int workers);

// In a worker process: a worker of the bnps row, with its own PsClient to the
// server at job.port, calling BnForward back to back as the CallPlan says. A
// worker that stops leaves the others in a barrier; they fail at its (short)
// timeout, which is not their error. The first failing worker's status.
absl::StatusOr<std::vector<double>> BnpsWorker(const Job& job,
                                               RowControl* control);

// One row: a sync shard server in this process (5 s barrier timeout) and the
// pool's first `workers` processes. `metrics`: whether the server counts and
// times its calls (server/server_metrics.h), as bnps_server always does.
absl::StatusOr<Latency> BnpsLatency(WorkerPool& pool, int channels, int workers,
                                    const Settings& s, bool metrics = true);

}  // namespace bnps::bench

#endif  // BNPS_BENCH_BNPS_PEER_H_
