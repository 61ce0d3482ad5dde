#include "client/stream_exchanges.h"

#include <deque>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace bnps::client {
namespace {

// A stand-in for a device stream: one thread runs the launched functions in
// order, and only while the stream is open (a device still busy with the
// work queued before them, while closed).
class FakeStream : public HostFuncLauncher {
 public:
  FakeStream() : thread_([this] { Run(); }) {}
  ~FakeStream() override {
    {
      absl::MutexLock lock(&mu_);
      open_ = true;
      done_ = true;
    }
    thread_.join();
  }

  absl::Status Launch(void* stream, void (*fn)(void*), void* arg) override {
    absl::MutexLock lock(&mu_);
    if (stream != this) return absl::InternalError("another stream");
    queue_.emplace_back(fn, arg);
    return absl::OkStatus();
  }

  void SetOpen(bool open) {
    absl::MutexLock lock(&mu_);
    open_ = open;
  }

 private:
  bool Ready() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return done_ || (open_ && !queue_.empty());
  }

  void Run() {
    for (;;) {
      std::pair<void (*)(void*), void*> next;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &FakeStream::Ready));
        if (queue_.empty()) return;  // done
        next = queue_.front();
        queue_.pop_front();
      }
      next.first(next.second);
    }
  }

  absl::Mutex mu_;
  std::deque<std::pair<void (*)(void*), void*>> queue_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Launches on a FakeStream it does not own.
class Forward : public HostFuncLauncher {
 public:
  explicit Forward(FakeStream* to) : to_(to) {}
  absl::Status Launch(void* stream, void (*fn)(void*), void* arg) override {
    return to_->Launch(stream, fn, arg);
  }

 private:
  FakeStream* to_;
};

// A job that appends `id` to `log` (its exchange, or its fallback as -id)
// and fails when `fail`.
StreamExchanges::Job Record(std::vector<int>* log, int id, bool fail = false) {
  return {[log, id, fail]() {
            log->push_back(id);
            return fail ? absl::DeadlineExceededError("peer 1 is gone")
                        : absl::OkStatus();
          },
          [log, id]() { log->push_back(-id); }};
}

TEST(StreamExchangesTest, JobsRunInTheStreamsOrderAfterItsEarlierWork) {
  auto stream = std::make_unique<FakeStream>();
  FakeStream* s = stream.get();
  StreamExchanges q(std::move(stream));
  std::vector<int> log;
  s->SetOpen(false);  // the device is busy with earlier work
  for (int id = 1; id <= 3; ++id) {
    ASSERT_TRUE(q.Enqueue(s, Record(&log, id)).ok());
  }
  EXPECT_EQ(q.pending(), 3);
  EXPECT_EQ(q.Drain(absl::Milliseconds(20)).code(),
            absl::StatusCode::kDeadlineExceeded);
  s->SetOpen(true);
  ASSERT_TRUE(q.Drain(absl::Seconds(10)).ok());
  EXPECT_EQ(log, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(q.pending(), 0);
  EXPECT_EQ(q.completed(), 3);
  EXPECT_EQ(q.fell_back(), 0);
}

TEST(StreamExchangesTest, AFailureFallsBackAndLaterJobsSkipTheirExchange) {
  auto stream = std::make_unique<FakeStream>();
  FakeStream* s = stream.get();
  StreamExchanges q(std::move(stream));
  std::vector<int> log;
  s->SetOpen(false);
  ASSERT_TRUE(q.Enqueue(s, Record(&log, 1)).ok());
  ASSERT_TRUE(q.Enqueue(s, Record(&log, 2, /*fail=*/true)).ok());
  ASSERT_TRUE(q.Enqueue(s, Record(&log, 3)).ok());
  s->SetOpen(true);
  const absl::Status drained = q.Drain(absl::Seconds(10));
  EXPECT_EQ(drained.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(drained.message(), "peer 1 is gone");
  // Job 2 tried and fell back; job 3 never talked to the servers.
  EXPECT_EQ(log, (std::vector<int>{1, 2, -2, -3}));
  EXPECT_EQ(q.fell_back(), 2);
  // Sticky: nothing more is queued, and every call says why.
  EXPECT_EQ(q.Enqueue(s, Record(&log, 4)).message(), "peer 1 is gone");
  EXPECT_EQ(q.Drain(absl::Seconds(1)).message(), "peer 1 is gone");
  EXPECT_EQ(q.completed(), 3);
}

TEST(StreamExchangesTest, ALaunchThatFailsQueuesNothing) {
  auto stream = std::make_unique<FakeStream>();
  FakeStream* s = stream.get();
  StreamExchanges q(std::move(stream));
  std::vector<int> log;
  int other_stream = 0;
  EXPECT_EQ(q.Enqueue(&other_stream, Record(&log, 1)).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(q.pending(), 0);
  EXPECT_TRUE(q.Drain(absl::Seconds(1)).ok());
  ASSERT_TRUE(q.Enqueue(s, Record(&log, 2)).ok());
  EXPECT_TRUE(q.Drain(absl::Seconds(10)).ok());
  EXPECT_EQ(log, (std::vector<int>{2}));
}

TEST(StreamExchangesTest, QueuedJobsOutliveTheQueue) {
  auto stream = std::make_unique<FakeStream>();
  FakeStream* s = stream.get();
  std::vector<int> log;
  s->SetOpen(false);
  {
    StreamExchanges q(std::make_unique<Forward>(s));
    ASSERT_TRUE(q.Enqueue(s, Record(&log, 1)).ok());
  }  // the queue is gone; its job still waits on the stream
  s->SetOpen(true);
  stream.reset();  // runs what is queued, then stops
  EXPECT_EQ(log, (std::vector<int>{1}));
}

TEST(StreamExchangesTest, TheInlineLauncherRunsEachJobAtOnce) {
  StreamExchanges q(NewInlineLauncher());
  std::vector<int> log;
  ASSERT_TRUE(q.Enqueue(nullptr, Record(&log, 1)).ok());
  EXPECT_EQ(log, (std::vector<int>{1}));
  // A failing job reports at the next call, as on a stream.
  ASSERT_TRUE(q.Enqueue(nullptr, Record(&log, 2, /*fail=*/true)).ok());
  EXPECT_EQ(q.Enqueue(nullptr, Record(&log, 3)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(log, (std::vector<int>{1, 2, -2}));
}

// A stand-in for a stream capturing a CUDA graph: launches are recorded,
// and Replay runs them all once, in order, as a replay of the graph does.
class Recorder : public HostFuncLauncher {
 public:
  absl::Status Launch(void* /*stream*/, void (*fn)(void*), void* arg) override {
    nodes_.emplace_back(fn, arg);
    return absl::OkStatus();
  }
  void Replay() {
    for (auto& [fn, arg] : nodes_) fn(arg);
  }

 private:
  std::vector<std::pair<void (*)(void*), void*>> nodes_;
};

TEST(StreamExchangesTest, AReplayableJobRunsAtEveryReplayAndFailsSticky) {
  auto recorder = std::make_unique<Recorder>();
  Recorder* graph = recorder.get();
  StreamExchanges q(std::move(recorder));
  int runs = 0;
  bool fail = false;
  StreamExchanges::Job job;
  job.exchange = [&]() -> absl::Status {
    ++runs;
    absl::SleepFor(absl::Milliseconds(2));  // the exchange's time
    return fail ? absl::DeadlineExceededError("a peer stopped")
                : absl::OkStatus();
  };
  int fallbacks = 0;
  job.fallback = [&] { ++fallbacks; };
  ASSERT_TRUE(q.EnqueueReplayable(nullptr, std::move(job)).ok());
  EXPECT_EQ(q.pending(), 0);  // how often it runs is the replays'
  for (int i = 0; i < 3; ++i) graph->Replay();
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(q.completed(), 3);
  EXPECT_GE(q.exchange_time(), absl::Milliseconds(6));
  EXPECT_TRUE(q.Drain(absl::Seconds(1)).ok());
  EXPECT_EQ(q.drain_waits(), 0);
  fail = true;
  graph->Replay();  // the failure of a replay surfaces at the next drain
  graph->Replay();  // and the next replay skips its exchange
  EXPECT_EQ(runs, 4);
  EXPECT_EQ(fallbacks, 2);
  EXPECT_EQ(q.Drain(absl::Seconds(1)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(StreamExchangesTest, ADrainThatWaitsIsCounted) {
  auto owned = std::make_unique<FakeStream>();
  FakeStream* stream = owned.get();
  StreamExchanges q(std::move(owned));
  std::vector<int> log;
  stream->SetOpen(false);  // the device busy: the job stays queued
  ASSERT_TRUE(q.Enqueue(stream, Record(&log, 1)).ok());
  EXPECT_EQ(q.drain_waits(), 0);
  EXPECT_EQ(q.Drain(absl::Milliseconds(10)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(q.drain_waits(), 1);
  stream->SetOpen(true);
  for (int i = 0; i < 1000 && q.pending() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(q.Drain(absl::Seconds(10)).ok());  // nothing queued: no wait
  EXPECT_EQ(q.drain_waits(), 1);
}

TEST(StreamExchangesTest, WithoutADriverTheCudaLauncherSaysWhy) {
  auto launcher = NewCudaHostFuncLauncher();
  if (launcher.ok()) {
    GTEST_SKIP() << "this machine has a CUDA driver (the GPU run tests the "
                    "launcher on a stream: python tests, tools/gpu/run.sh)";
  }
  EXPECT_EQ(launcher.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(launcher.status().message().find("libcuda.so.1"), std::string::npos)
      << launcher.status();
}

}  // namespace
}  // namespace bnps::client
