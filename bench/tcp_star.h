// The "tcp" peer of the BN latency table: the star barrier (star_barrier.h)
// on raw loopback TCP, without gRPC or HTTP/2. Each of W workers keeps one
// connection (TCP_NODELAY) and sends a frame per round: an 8-byte header
// (payload length and group size W, little-endian uint32s) and 16C + 8
// payload bytes, as much as a bnps BN forward exchange carries. One server
// thread waits on epoll for all connections; once W frames of a group are
// in, it writes every member its own frame back. A round so costs W sends
// and W receives each way and at most one server wake-up: the floor under
// any barrier served over TCP on the machine, below gRPC's "star".
//
// Thread-safety: TcpStarServer runs its own thread; the other functions are
// plain.

#ifndef BNPS_BENCH_TCP_STAR_H_
#define BNPS_BENCH_TCP_STAR_H_

#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/latency_job.h"
#include "bench/settings.h"
#include "bench/timing.h"
#include "bench/worker_pool.h"

namespace bnps::bench {

class TcpStarServer {
 public:
  // Listens on 127.0.0.1, a free port, and starts the thread.
  static absl::StatusOr<std::unique_ptr<TcpStarServer>> Start();
  ~TcpStarServer();  // stops the thread, closes every connection

  int port() const { return port_; }

 private:
  TcpStarServer() = default;
  void Run();

  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int stop_fd_ = -1;  // an eventfd that ends Run
  int port_ = 0;
  std::thread thread_;
};

// In a worker process: a worker of the tcp row, connected to the server at
// job.port, timing send + receive of one frame as the CallPlan says.
absl::StatusOr<std::vector<double>> TcpStarWorker(const Job& job,
                                                  RowControl* control);

// One row of tcp against `server` with the pool's first `workers` processes.
absl::StatusOr<Latency> TcpStarLatency(WorkerPool& pool,
                                       const TcpStarServer& server,
                                       int channels, int workers,
                                       const Settings& s);

}  // namespace bnps::bench

#endif  // BNPS_BENCH_TCP_STAR_H_
