// The gloo peer of the BN latency table: a ring allreduce of 2C doubles (the
// sum and sum of squares that an allreduce-based SyncBN exchanges) among the
// W worker processes, over gloo's TCP transport on 127.0.0.1. gloo is
// Debian's libgloo-dev. With W = 1 an allreduce is a local copy.
//
// Thread-safety: plain functions; GlooLatency uses the pool from one thread.

#ifndef BNPS_BENCH_GLOO_PEER_H_
#define BNPS_BENCH_GLOO_PEER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "bench/latency_job.h"
#include "bench/settings.h"
#include "bench/timing.h"
#include "bench/worker_pool.h"

namespace bnps::bench {

// In a worker process: rank job.rank of job.workers rendezvous through the
// files of job.dir, then times ring allreduces of 2 * job.channels doubles as
// the CallPlan says. INTERNAL with gloo's message if gloo throws (for
// example when a rank is not there within its 20 s timeout).
absl::StatusOr<std::vector<double>> GlooWorker(const Job& job,
                                               RowControl* control);

// One row: gloo's ring allreduce among the pool's first `workers` processes,
// rendezvousing in a temporary directory removed afterwards.
absl::StatusOr<Latency> GlooLatency(WorkerPool& pool, int channels, int workers,
                                    const Settings& s);

}  // namespace bnps::bench

#endif  // BNPS_BENCH_GLOO_PEER_H_
