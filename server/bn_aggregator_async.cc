// BnAggregator's async BN forwards: the bounded mode (AsyncForward, each
// worker's latest moments within the staleness bound) and the exact one
// (ExactStaleForward, through each layer's StaleWindow), and the running
// statistics both mix. Apart from bn_aggregator.cc to keep each file to one
// reading.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/bn_aggregator.h"

namespace bnps::server {

void BnAggregator::AsyncForward(int worker, int64_t step, Layer& layer,
                                bn::Moments local, Done done, Ready* ready) {
  if (layer.latest.empty()) layer.latest.resize(options_.num_workers);
  policy::LatestMoments& own = layer.latest[worker];
  if (step < own.step) {
    absl::Status past = absl::FailedPreconditionError(absl::StrCat(
        "BN forward step ", step, " of worker ", worker,
        " is from the past (it sent step ", own.step, ")"));
    ready->push_back([done = std::move(done), past] { done(past); });
    return;
  }
  own.step = step;
  own.moments = std::move(local);
  contributed_[worker] = true;
  policy::AsyncMerge merge =
      policy::MergeForAsync(layer.latest, live_, group_, worker, step,
                            options_.staleness, layer.channels);
  Reply reply;
  reply.moments = std::move(merge.others);
  reply.contributors = merge.contributors;
  reply.staleness = std::move(merge.staleness);
  MixAsync(layer, merge.all);
  reply.running = layer.running;
  ready->push_back([done = std::move(done), r = std::move(reply)]() mutable {
    done(std::move(r));
  });
}

void BnAggregator::MixAsync(Layer& layer, const bn::Moments& all) {
  if (!layer.running.has_value()) {
    layer.running = bn::RunningStats::Initial(layer.channels);
  }
  if (all.count >= 2) {
    const double m =
        1.0 - std::pow(1.0 - options_.momentum, 1.0 / std::max(1, NumLive()));
    bn::MixIntoRunningStats(all, m, &*layer.running);
  }
}

void BnAggregator::ExactStaleForward(int worker, int64_t step,
                                     const std::string& name,
                                     bn::Moments local, absl::Time deadline,
                                     Done done, Ready* ready) {
  Layer& layer = layers_[name];
  if (layer.window == nullptr) {
    layer.window = std::make_unique<StaleWindow>(
        options_.num_workers, options_.bn_staleness, layer.channels, group_);
  }
  contributed_[worker] = true;
  // The answer runs without the lock (from `ready`, maybe on the thread of
  // the worker whose moments completed it), then takes it to mix the
  // running stats of the layer, found again by name.
  layer.window->Add(
      worker, step, std::move(local), deadline,
      [this, name, done = std::move(done)](
          absl::StatusOr<StaleWindow::Answer> a) mutable {
        if (!a.ok()) return done(a.status());
        Reply reply;
        reply.moments = std::move(a->others);
        reply.contributors = a->contributors;
        reply.staleness.assign(a->contributors, options_.bn_staleness);
        {
          absl::MutexLock lock(&mu_);
          auto it = layers_.find(name);
          if (it != layers_.end()) {
            MixAsync(it->second, a->all);
            reply.running = it->second.running;
          }
        }
        done(std::move(reply));
      });
  layer.window->Evaluate(live_, failed_, ready);
}

void BnAggregator::EvaluateWindows(Ready* ready) {
  for (auto& [name, layer] : layers_) {
    if (layer.window != nullptr) layer.window->Evaluate(live_, failed_, ready);
  }
}

}  // namespace bnps::server
