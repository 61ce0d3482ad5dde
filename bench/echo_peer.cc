#include "bench/echo_peer.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace bnps::bench {
namespace {

// Runs fn(i) for i in [0, n) on n threads and joins them.
template <typename Fn>
void OnThreads(int n, Fn fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([&fn, i] { fn(i); });
  for (std::thread& t : threads) t.join();
}

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(60));
}

}  // namespace

absl::StatusOr<std::vector<double>> EchoWorker(const Job& job,
                                               RowControl* control) {
  const bool gather = job.peer == Peer::kStar;
  std::unique_ptr<EchoService::Stub> stub = NewEchoStub(job.port);
  grpc::ClientContext context;
  SetDeadline(&context);
  auto stream = gather ? stub->Gather(&context) : stub->Echo(&context);
  Blob request, reply;
  request.mutable_data()->assign(16 * job.channels + 8, 'x');
  if (gather) request.set_group(job.workers);
  std::vector<double> us;
  CallPlan plan(job, control);
  for (int i = 0; plan.MayStart(i) && KeepGoing(job, control); ++i) {
    const Clock::time_point t0 = Clock::now();
    if (!stream->Write(request) || !stream->Read(&reply)) {
      control->stop.store(true);
      break;
    }
    if (i >= job.warmup) us.push_back(MicrosSince(t0));
    plan.Finished(i);
  }
  stream->WritesDone();
  absl::Status status = FromGrpc(stream->Finish(), "Echo");
  if (!status.ok()) return status;
  return us;
}

absl::StatusOr<Latency> EchoLatency(WorkerPool& pool, const EchoServer& server,
                                    int channels, int workers, bool gather,
                                    const Settings& s) {
  Job job = RowJob(gather ? Peer::kStar : Peer::kEcho, channels, workers, s);
  job.port = server.port();
  return pool.Run(job);
}

absl::Status EchoPushPull(
    const std::vector<std::unique_ptr<EchoService::Stub>>& stubs,
    const std::vector<std::string>& sources) {
  const int n = static_cast<int>(stubs.size());
  std::vector<absl::Status> status(n);
  OnThreads(n, [&](int i) {
    grpc::ClientContext context;
    SetDeadline(&context);
    Count response;
    auto writer = stubs[i]->Upload(&context, &response);
    const std::string& source = sources[i];
    const int64_t size = static_cast<int64_t>(source.size());
    Blob chunk;
    for (int64_t sent = 0; sent < size; sent += kEchoChunkBytes) {
      chunk.mutable_data()->assign(source.data() + sent,
                                   std::min(size - sent, kEchoChunkBytes));
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    status[i] = FromGrpc(writer->Finish(), "Upload");
    if (status[i].ok() && response.bytes() != size) {
      status[i] = absl::DataLossError("Upload: bytes lost");
    }
  });
  OnThreads(n, [&](int i) {
    if (!status[i].ok()) return;
    grpc::ClientContext context;
    SetDeadline(&context);
    Count request;
    request.set_bytes(static_cast<int64_t>(sources[i].size()));
    auto reader = stubs[i]->Download(&context, request);
    Blob chunk;
    int64_t got = 0;
    while (reader->Read(&chunk)) got += chunk.data().size();
    status[i] = FromGrpc(reader->Finish(), "Download");
    if (status[i].ok() && got != static_cast<int64_t>(sources[i].size())) {
      status[i] = absl::DataLossError("Download: bytes lost");
    }
  });
  for (const absl::Status& st : status) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace bnps::bench
