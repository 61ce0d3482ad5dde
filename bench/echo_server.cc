#include "bench/echo_server.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/limits.h"
#include "bench/star_barrier.h"

namespace bnps::bench {
namespace {

class EchoReactor : public grpc::ServerBidiReactor<Blob, Blob> {
 public:
  EchoReactor() { StartRead(&blob_); }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    StartWrite(&blob_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::CANCELLED);
    StartRead(&blob_);
  }
  void OnDone() override { delete this; }

 private:
  Blob blob_;
};

class UploadReactor : public grpc::ServerReadReactor<Blob> {
 public:
  explicit UploadReactor(Count* response) : response_(response) {
    StartRead(&blob_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      response_->set_bytes(bytes_);
      return Finish(grpc::Status::OK);
    }
    bytes_ += blob_.data().size();
    StartRead(&blob_);
  }
  void OnDone() override { delete this; }

 private:
  Count* response_;
  Blob blob_;
  int64_t bytes_ = 0;
};

// What Downloads send: `bytes` of distinct memory, as a pull sends the
// store's values (not one buffer over and over, which stays in the cache).
// Filled once; replaced by a larger one when a larger download is asked for.
class DownloadSource {
 public:
  std::shared_ptr<const std::string> Get(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    if (source_ == nullptr || static_cast<int64_t>(source_->size()) < bytes) {
      source_ = std::make_shared<const std::string>(bytes, 'x');
    }
    return source_;
  }

 private:
  absl::Mutex mu_;
  std::shared_ptr<const std::string> source_ ABSL_GUARDED_BY(mu_);
};

class DownloadReactor : public grpc::ServerWriteReactor<Blob> {
 public:
  DownloadReactor(int64_t bytes, std::shared_ptr<const std::string> source)
      : bytes_(bytes), source_(std::move(source)) {
    WriteNext();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::CANCELLED);
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (sent_ >= bytes_) return Finish(grpc::Status::OK);
    const int64_t n = std::min(bytes_ - sent_, kEchoChunkBytes);
    chunk_.mutable_data()->assign(source_->data() + sent_, n);
    sent_ += n;
    StartWrite(&chunk_);
  }

  const int64_t bytes_;
  int64_t sent_ = 0;
  const std::shared_ptr<const std::string> source_;
  Blob chunk_;
};

}  // namespace

class EchoServer::Service final : public EchoService::CallbackService {
  grpc::ServerBidiReactor<Blob, Blob>* Echo(
      grpc::CallbackServerContext*) override {
    return new EchoReactor();
  }
  grpc::ServerBidiReactor<Blob, Blob>* Gather(
      grpc::CallbackServerContext*) override {
    return new GatherReactor(&hall_);
  }
  grpc::ServerReadReactor<Blob>* Upload(grpc::CallbackServerContext*,
                                        Count* response) override {
    return new UploadReactor(response);
  }
  grpc::ServerWriteReactor<Blob>* Download(grpc::CallbackServerContext*,
                                           const Count* request) override {
    const int64_t bytes = std::max<int64_t>(0, request->bytes());
    return new DownloadReactor(bytes, source_.Get(bytes));
  }

 private:
  GatherHall hall_;
  DownloadSource source_;
};

std::unique_ptr<EchoService::Stub> NewEchoStub(int port) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(proto::kMaxMessageBytes);
  args.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  return EchoService::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                grpc::InsecureChannelCredentials(), args));
}

EchoServer::EchoServer() : service_(std::make_unique<Service>()) {}

absl::StatusOr<std::unique_ptr<EchoServer>> EchoServer::Start() {
  std::unique_ptr<EchoServer> es(new EchoServer());
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &es->port_);
  builder.RegisterService(es->service_.get());
  builder.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(proto::kMaxMessageBytes);
  es->server_ = builder.BuildAndStart();
  if (es->server_ == nullptr || es->port_ == 0) {
    return absl::UnavailableError("cannot start the echo server");
  }
  return es;
}

EchoServer::~EchoServer() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now());
}

}  // namespace bnps::bench
