#include "worker/dropped_watch.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "util/log_escape.h"

namespace bnps::worker {

DroppedWatch::DroppedWatch(std::function<absl::Status()> dropped,
                           std::function<void(const absl::Status&)> on_dropped,
                           Options options)
    : dropped_(std::move(dropped)),
      on_dropped_(std::move(on_dropped)),
      options_(options),
      thread_([this] { Watch(); }) {}

DroppedWatch::~DroppedWatch() {
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  thread_.join();
}

void DroppedWatch::Watch() {
  absl::Time dropped_at = absl::InfiniteFuture();
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&done_), options_.poll)) {
    const absl::Status dropped = dropped_();
    if (dropped.ok()) continue;
    const absl::Time now = absl::Now();
    if (dropped_at == absl::InfiniteFuture()) dropped_at = now;
    if (now - dropped_at < options_.grace) continue;
    on_dropped_(dropped);
    return;
  }
}

void ExitDropped(const absl::Status& why) {
  std::fflush(stdout);
  // The message may quote a server's words.
  std::fprintf(stderr, "bnps_worker: %s\n",
               util::EscapeForLog(why.message()).c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace bnps::worker
