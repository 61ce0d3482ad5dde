#include "worker/server_bn_exchange.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace bnps::worker {

absl::StatusOr<bn::Moments> ServerBnExchange::Forward(
    const std::string& layer, const bn::Moments& local) {
  const absl::Time start = absl::Now();
  // The layer keeps its own running statistics (nn::BatchNorm): none are
  // asked for.
  absl::StatusOr<client::BnForwardOutcome> r = rule_.Forward(
      [this] { return absl::StatusOr<client::PsClient*>(client_); }, layer,
      step_, local);
  const absl::Duration took = absl::Now() - start;
  elapsed_ += took;
  if (metrics_ != nullptr) {
    metrics_->BnRoundTrip(layer, WorkerMetrics::kForward, took);
  }
  if (!r.ok()) return r.status();
  return std::move(r->normalize);
}

absl::StatusOr<bn::BackwardSums> ServerBnExchange::Backward(
    const std::string& layer, const bn::BackwardSums& local) {
  if (!rule_.GlobalBackward()) return local;
  const absl::Time start = absl::Now();
  absl::StatusOr<bn::BackwardSums> r = client_->BnBackward(layer, step_, local);
  const absl::Duration took = absl::Now() - start;
  elapsed_ += took;
  if (metrics_ != nullptr) {
    metrics_->BnRoundTrip(layer, WorkerMetrics::kBackward, took);
  }
  return r;
}

class ServerBnExchange::CallThread {
 public:
  CallThread() : thread_([this] { Loop(); }) {}
  ~CallThread() {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &CallThread::NotPosted));
      state_ = kStop;
    }
    thread_.join();
  }

  // Hands `call` to the thread. REQUIRES: the previous call was waited for.
  void Run(std::function<void()> call) {
    absl::MutexLock lock(&mu_);
    call_ = std::move(call);
    state_ = kPosted;
  }
  // Returns once the call Run handed over is done.
  void Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &CallThread::Done));
    state_ = kIdle;
  }

 private:
  enum State { kIdle, kPosted, kDone, kStop };

  void Loop() {
    while (true) {
      std::function<void()> call;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &CallThread::PostedOrStopping));
        if (state_ == kStop) return;
        call = std::move(call_);
      }
      call();
      absl::MutexLock lock(&mu_);
      state_ = kDone;
    }
  }
  bool NotPosted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ != kPosted;
  }
  bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ == kDone;
  }
  bool PostedOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ == kPosted || state_ == kStop;
  }

  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = kIdle;
  std::function<void()> call_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: started once the rest is made
};

ServerBnExchange::ServerBnExchange(client::PsClient* client,
                                   policy::Policy policy,
                                   WorkerMetrics* metrics)
    : client_(client),
      rule_(policy, /*job_bn_momentum=*/0.0),
      metrics_(metrics) {}

ServerBnExchange::~ServerBnExchange() = default;

namespace {

// The exchange's call on the exchange's thread; Wait waits for it.
class ThreadedBackward final : public nn::PendingBackward {
 public:
  ThreadedBackward(ServerBnExchange::CallThread* thread,
                   client::PsClient* client, std::string layer, int64_t step,
                   bn::BackwardSums local, absl::Duration* elapsed,
                   WorkerMetrics* metrics)
      : thread_(thread),
        layer_(std::move(layer)),
        elapsed_(elapsed),
        metrics_(metrics) {
    thread_->Run([this, client, step, local = std::move(local)] {
      const absl::Time start = absl::Now();
      result_ = client->BnBackward(layer_, step, local);
      took_ = absl::Now() - start;
    });
  }
  ~ThreadedBackward() override {
    if (!waited_) thread_->Wait();
  }

  absl::StatusOr<bn::BackwardSums> Wait() override {
    const absl::Time start = absl::Now();
    thread_->Wait();
    waited_ = true;
    *elapsed_ += absl::Now() - start;
    if (metrics_ != nullptr) {
      metrics_->BnRoundTrip(layer_, WorkerMetrics::kBackward, took_);
    }
    return std::move(result_);
  }

 private:
  ServerBnExchange::CallThread* const thread_;  // not owned
  const std::string layer_;
  absl::Duration* const elapsed_;  // not owned
  WorkerMetrics* const metrics_;   // not owned; may be null
  bool waited_ = false;
  // Written by the call on the thread, read after Wait.
  absl::StatusOr<bn::BackwardSums> result_;
  absl::Duration took_;
};

}  // namespace

std::unique_ptr<nn::PendingBackward> ServerBnExchange::StartBackward(
    const std::string& layer, const bn::BackwardSums& local) {
  if (!rule_.GlobalBackward()) {
    return std::make_unique<nn::DoneBackward>(local);
  }
  if (call_thread_ == nullptr) call_thread_ = std::make_unique<CallThread>();
  return std::make_unique<ThreadedBackward>(call_thread_.get(), client_, layer,
                                            step_, local, &elapsed_, metrics_);
}

}  // namespace bnps::worker
