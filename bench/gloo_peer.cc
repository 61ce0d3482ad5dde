#include "bench/gloo_peer.h"

#include <stdlib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

namespace bnps::bench {

absl::StatusOr<std::vector<double>> GlooWorker(const Job& job,
                                               RowControl* control) {
  try {
    gloo::transport::tcp::attr attr("127.0.0.1");
    attr.ai_family = AF_INET;
    std::shared_ptr<gloo::transport::Device> device =
        gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(job.dir);
    auto context =
        std::make_shared<gloo::rendezvous::Context>(job.rank, job.workers);
    context->setTimeout(std::chrono::seconds(20));
    context->connectFullMesh(store, device);

    std::vector<double> data(2 * job.channels);
    gloo::AllreduceOptions options(context);
    options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    options.setOutput(data.data(), data.size());
    options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<double>));
    std::vector<double> us;
    CallPlan plan(job, control);
    for (int i = 0; plan.MayStart(i); ++i) {
      for (int c = 0; c < 2 * job.channels; ++c) data[c] = job.rank + 0.001 * c;
      const Clock::time_point t0 = Clock::now();
      gloo::allreduce(options);
      if (i >= job.warmup) us.push_back(MicrosSince(t0));
      plan.Finished(i);
    }
    // Keeps every rank's sockets open until all are done.
    gloo::BarrierOptions barrier(context);
    gloo::barrier(barrier);
    return us;
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

absl::StatusOr<Latency> GlooLatency(WorkerPool& pool, int channels, int workers,
                                    const Settings& s) {
  Job job = RowJob(Peer::kGloo, channels, workers, s);
  const std::string dir =
      std::filesystem::temp_directory_path() / "bnps_bench_gloo_XXXXXX";
  if (dir.size() >= sizeof(job.dir)) {
    return absl::InternalError("the temporary directory's path is too long");
  }
  std::memcpy(job.dir, dir.c_str(), dir.size() + 1);
  if (mkdtemp(job.dir) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  absl::StatusOr<Latency> latency = pool.Run(job);
  std::error_code ignored;
  std::filesystem::remove_all(job.dir, ignored);
  return latency;
}

}  // namespace bnps::bench
