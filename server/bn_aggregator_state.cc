// BnAggregator's checkpoint side: what a checkpoint keeps (Export) and
// putting it back (Import). Apart from bn_aggregator.cc to keep each file
// to one reading.

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/bn_aggregator.h"

namespace bnps::server {

BnState BnAggregator::Export() const {
  absl::MutexLock lock(&mu_);
  BnState state;
  for (const auto& [name, l] : layers_) {
    BnState::Layer out{name, l.channels, l.running, -1, -1};
    if (auto it = l.newest_finished.find(Phase::kForward);
        it != l.newest_finished.end()) {
      out.newest_forward = it->second;
    }
    if (auto it = l.newest_finished.find(Phase::kBackward);
        it != l.newest_finished.end()) {
      out.newest_backward = it->second;
    }
    state.layers.push_back(std::move(out));
  }
  state.newest_step = newest_step_;
  state.contributed = contributed_;
  return state;
}

absl::Status BnAggregator::Import(const BnState& state,
                                  const absl::Status& why) {
  if (state.contributed.size() != static_cast<size_t>(options_.num_workers)) {
    return absl::InvalidArgumentError(
        "checkpointed BN state has another worker count");
  }
  std::map<std::string, Layer> layers;
  for (const BnState::Layer& l : state.layers) {
    if (l.running.has_value() &&
        (static_cast<int64_t>(l.running->mean.size()) != l.channels ||
         static_cast<int64_t>(l.running->var.size()) != l.channels)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpointed BN layer '", l.name, "' does not fit its channels"));
    }
    Layer& out = layers[l.name];
    out.channels = l.channels;
    out.running = l.running;
    out.latest.resize(options_.num_workers);
    if (l.newest_forward >= 0) out.newest_finished[Phase::kForward] = l.newest_forward;
    if (l.newest_backward >= 0) {
      out.newest_finished[Phase::kBackward] = l.newest_backward;
    }
  }
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, b] : barriers_) {
      if (b.result != nullptr) continue;
      for (auto& [worker, done] : b.waiting) {
        ready.push_back([done = std::move(done), why] { done(why); });
      }
    }
    barriers_.clear();
    for (auto& [name, layer] : layers_) {
      if (layer.window != nullptr) layer.window->FailAll(why, &ready);
    }
    ReleaseRecalBytes();  // the old layers' and moments' charges
    layers_ = std::move(layers);
    newest_step_ = state.newest_step;
    contributed_ = state.contributed;
  }
  for (auto& fn : ready) fn();
  return absl::OkStatus();
}

}  // namespace bnps::server
