// The raw-gRPC peers, the client side of echo_server.h. In the BN latency
// table: "echo", each worker with its own channel and bidi stream writing
// 16C + 8 bytes (what a bnps BN forward exchange carries each way) and reading
// them back; and "star", the same through Gather, answered once all W are in.
// In the gradient table: the same bytes as a bnps push + pull, up in a
// client-streaming Upload and down in a server-streaming Download.
//
// Thread-safety: plain functions.

#ifndef BNPS_BENCH_ECHO_PEER_H_
#define BNPS_BENCH_ECHO_PEER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/echo.grpc.pb.h"
#include "bench/echo_server.h"
#include "bench/latency_job.h"
#include "bench/settings.h"
#include "bench/timing.h"
#include "bench/worker_pool.h"

namespace bnps::bench {

// In a worker process: a worker of the echo or star row (job.peer), with its
// own channel and stream to the echo server at job.port, echoing
// 16 * job.channels + 8 bytes as the CallPlan says; in the star every round
// is answered once all job.workers have sent. The stream's status if it
// fails.
absl::StatusOr<std::vector<double>> EchoWorker(const Job& job,
                                               RowControl* control);

// One row of echo (gather false) or star (gather true) against `server`,
// with the pool's first `workers` processes.
absl::StatusOr<Latency> EchoLatency(WorkerPool& pool, const EchoServer& server,
                                    int channels, int workers, bool gather,
                                    const Settings& s);

// Moves `bytes` up (Upload) and then down (Download), split over `stubs`,
// each direction in parallel over the stubs on a thread each. Stub i uploads
// sources[i] (its share of the bytes: distinct memory, as a push sends the
// gradients' own) and downloads as many. The first call's error; DATA_LOSS if
// a server counted other than what was sent.
// REQUIRES: stubs.size() == sources.size().
absl::Status EchoPushPull(
    const std::vector<std::unique_ptr<EchoService::Stub>>& stubs,
    const std::vector<std::string>& sources);

}  // namespace bnps::bench

#endif  // BNPS_BENCH_ECHO_PEER_H_
