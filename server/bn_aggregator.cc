#include "server/bn_aggregator.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "staleness/clock_table.h"

namespace bnps::server {
namespace {

// What a filed recalibration batch of `channels` holds: two arrays and the
// map's node.
int64_t RecalBytes(int64_t channels) { return 2 * 8 * channels + 96; }

// Finished barriers are kept this many steps back, so a retried contribution
// gets the answer the others got.
constexpr int64_t kKeepSteps = 16;

const char* PhaseName(int phase) {
  static const char* const kNames[] = {"forward", "backward", "recal-finish",
                                       "local-running"};
  return kNames[phase];
}

}  // namespace

BnAggregator::BnAggregator(Options options)
    : options_(options),
      live_(options.num_workers, true),
      failed_(options.num_workers),
      contributed_(options.num_workers, false),
      recal_bytes_(options.num_workers, 0),
      group_(policy::BnGroupOfWorkers(options.group_size, options.num_workers)) {
  if (options.group_by_host) {
    for (int w = 0; w < options.num_workers; ++w) group_.push_back(w);
  }
}

void BnAggregator::SetGroups(std::vector<int> group) {
  absl::MutexLock lock(&mu_);
  if (!options_.group_by_host ||
      group.size() != static_cast<size_t>(options_.num_workers)) {
    return;
  }
  group_ = std::move(group);
  groups_set_ = true;
  for (auto& [name, layer] : layers_) {
    if (layer.window != nullptr) layer.window->set_group(group_);
  }
}

BnAggregator::~BnAggregator() {
  absl::MutexLock lock(&mu_);
  ReleaseRecalBytes();
}

void BnAggregator::ReleaseRecalBytes() {
  int64_t held = 0;
  for (int64_t& b : recal_bytes_) {
    held += b;
    b = 0;
  }
  for (auto& [name, layer] : layers_) {
    held += layer.charged;
    layer.charged = 0;
  }
  if (options_.memory != nullptr) options_.memory->Release(held);
}

int64_t BnAggregator::layer_bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t bytes = 0;
  for (const auto& [name, layer] : layers_) bytes += layer.charged;
  return bytes;
}

absl::Status BnAggregator::ChargeMemory(int64_t bytes, const std::string& what) {
  if (options_.memory == nullptr ||
      options_.memory->TryChargeLasting(bytes)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " (", bytes, " bytes) does not fit the server's memory budget (",
      options_.memory->left(), " of ", options_.memory->limit(),
      " bytes left, half of the budget kept for answers; "
      "--bn_memory_budget_mb)"));
}

int BnAggregator::NumLive() const {
  int n = 0;
  for (bool l : live_) n += l;
  return n;
}

absl::Status BnAggregator::CheckWorker(int worker) const {
  if (worker < 0 || worker >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " outside the job's [0, ", options_.num_workers, ")"));
  }
  if (!live_[worker]) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker, " was removed from the job"));
  }
  return failed_[worker];
}

absl::Status BnAggregator::Admit(int worker, const std::string& layer,
                                 int64_t channels) {
  if (absl::Status s = CheckWorker(worker); !s.ok()) return s;
  if (layer.empty()) return absl::InvalidArgumentError("empty BN layer name");
  auto it = layers_.find(layer);
  if (it == layers_.end()) {
    const int64_t bytes =
        kLayerRecordBytes + static_cast<int64_t>(layer.size());
    if (absl::Status s = ChargeMemory(bytes, "a new BN layer"); !s.ok()) {
      return s;
    }
    it = layers_.emplace(layer, Layer()).first;
    it->second.charged = bytes;
  }
  Layer& l = it->second;
  if (channels > 0) {
    if (l.channels == 0) {
      const int64_t bytes =
          32 * channels *
          (options_.policy == policy::Policy::kAsync ? options_.num_workers : 1);
      if (absl::Status s = ChargeMemory(
              bytes, absl::StrCat("BN layer '", layer, "''s ", channels,
                                  " channels"));
          !s.ok()) {
        return s;
      }
      l.charged += bytes;
      l.channels = channels;
    }
    if (l.channels != channels) {
      return absl::InvalidArgumentError(absl::StrCat(
          "BN layer '", layer, "' has ", l.channels, " channels, got ", channels));
    }
  }
  return absl::OkStatus();
}

int64_t BnAggregator::ParameterVersion() const {
  // Only sync's step rule uses it.
  if (options_.policy != policy::Policy::kSync || !options_.parameter_version) {
    return 0;
  }
  return options_.parameter_version();
}

absl::Status BnAggregator::CheckStep(const char* phase, const std::string& layer,
                                     int64_t step, int64_t version) const {
  if (step < 0) return absl::InvalidArgumentError("negative step");
  const bool sync = options_.policy == policy::Policy::kSync;
  const int64_t staleness = sync ? 0 : options_.staleness;
  int64_t next = newest_step_ == INT64_MAX ? INT64_MAX : newest_step_ + 1;
  if (sync) next = std::max(next, version);
  if (staleness::Admissible(next, step, staleness)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "BN ", phase, " of layer '", layer, "' step ", step,
      " is from the future: the newest BN step on this shard is ", newest_step_,
      sync ? absl::StrCat(" and the parameters are at version ", version)
           : std::string(),
      ", so steps up to ", next + staleness,  // no overflow: step is beyond
      " are admissible"));
}

void BnAggregator::Forward(int worker, int64_t step, const std::string& layer,
                           bn::Moments local, absl::Time deadline, Done done) {
  const int64_t version = ParameterVersion();
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    absl::Status s = CheckWorker(worker);
    if (s.ok() && options_.policy != policy::Policy::kSync &&
        options_.policy != policy::Policy::kAsync) {
      s = absl::FailedPreconditionError(absl::StrCat(
          "policy ", policy::PolicyName(options_.policy),
          " normalizes with local statistics: no BN forward traffic"));
    }
    // The step before the layer: a refused call changes nothing.
    if (s.ok()) s = CheckStep("forward", layer, step, version);
    if (s.ok()) s = Admit(worker, layer, local.channels());
    if (!s.ok()) {
      ready.push_back([done = std::move(done), s] { done(s); });
    } else {
      newest_step_ = std::max(newest_step_, step);
      if (options_.policy == policy::Policy::kAsync &&
          options_.bn_staleness >= 0) {
        ExactStaleForward(worker, step, layer, std::move(local), deadline,
                          std::move(done), &ready);
      } else if (options_.policy == policy::Policy::kAsync) {
        AsyncForward(worker, step, layers_[layer], std::move(local),
                     std::move(done), &ready);
      } else {
        Contribute(worker, {layer, Phase::kForward, step},
                   Contribution{std::move(local), {}, {}}, deadline,
                   std::move(done), &ready);
      }
    }
  }
  for (auto& fn : ready) fn();
}

void BnAggregator::Backward(int worker, int64_t step, const std::string& layer,
                            bn::BackwardSums local, absl::Time deadline,
                            Done done) {
  const int64_t version = ParameterVersion();
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    absl::Status s = CheckWorker(worker);
    if (s.ok() && options_.policy != policy::Policy::kSync) {
      s = absl::FailedPreconditionError(
          absl::StrCat("policy ", policy::PolicyName(options_.policy),
                       " has no global BN backward reduction"));
    }
    if (s.ok()) s = CheckStep("backward", layer, step, version);
    if (s.ok()) s = Admit(worker, layer, local.sum_dy.size());
    if (!s.ok()) {
      ready.push_back([done = std::move(done), s] { done(s); });
    } else {
      newest_step_ = std::max(newest_step_, step);
      Contribute(worker, {layer, Phase::kBackward, step},
                 Contribution{{}, std::move(local), {}}, deadline,
                 std::move(done), &ready);
    }
  }
  for (auto& fn : ready) fn();
}

void BnAggregator::Recal(int worker, int64_t batch, const std::string& layer,
                         bn::Moments moments, Done done) {
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    s = Admit(worker, layer, moments.channels());
    if (s.ok() && batch < 0) s = absl::InvalidArgumentError("negative batch");
    if (s.ok()) {
      auto finished = barriers_.find({layer, Phase::kRecalFinish, 0});
      if (finished != barriers_.end() && finished->second.result != nullptr) {
        s = absl::FailedPreconditionError(absl::StrCat(
            "recalibration of BN layer '", layer, "' is already finished"));
      } else {
        const int64_t bytes = RecalBytes(moments.channels());
        auto& kept = layers_[layer].recal;
        const auto id = std::make_pair(worker, batch);
        if (kept.count(id) != 0) {
          // The first value of a (worker, batch) stays: retries are not
          // merged twice.
        } else if (bytes > options_.recal_bytes_per_worker - recal_bytes_[worker]) {
          s = absl::ResourceExhaustedError(absl::StrCat(
              "worker ", worker, " filed ", recal_bytes_[worker],
              " bytes of recalibration moments, the most one worker may "
              "(", options_.recal_bytes_per_worker, "): finish the "
              "recalibration (RecalFinish) with the batches filed"));
        } else if (absl::Status charged = ChargeMemory(
                       bytes, absl::StrCat("recalibration moments of worker ",
                                           worker));
                   !charged.ok()) {
          s = absl::ResourceExhaustedError(absl::StrCat(
              charged.message(), ": finish the recalibration (RecalFinish) "
              "with the batches filed"));
        } else {
          kept.emplace(id, std::move(moments));
          recal_bytes_[worker] += bytes;
          contributed_[worker] = true;
        }
      }
    }
  }
  if (s.ok()) {
    done(Reply{});
  } else {
    done(s);
  }
}

void BnAggregator::RecalFinish(int worker, const std::string& layer,
                               absl::Time deadline, Done done) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    absl::Status s = Admit(worker, layer, 0);
    if (!s.ok()) {
      ready.push_back([done = std::move(done), s] { done(s); });
    } else {
      Contribute(worker, {layer, Phase::kRecalFinish, 0}, Contribution{},
                 deadline, std::move(done), &ready);
    }
  }
  for (auto& fn : ready) fn();
}

void BnAggregator::LocalRunning(int worker, const std::string& layer,
                                bn::RunningStats running, absl::Time deadline,
                                Done done) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    absl::Status s = Admit(worker, layer, running.mean.size());
    if (s.ok() && running.var.size() != running.mean.size()) {
      s = absl::InvalidArgumentError("running mean and var differ in size");
    }
    if (s.ok() && options_.policy != policy::Policy::kLocal) {
      s = absl::FailedPreconditionError(absl::StrCat(
          "policy ", policy::PolicyName(options_.policy),
          " keeps running stats on the server; only local averages workers'"));
    }
    if (!s.ok()) {
      ready.push_back([done = std::move(done), s] { done(s); });
    } else {
      Contribute(worker, {layer, Phase::kLocalRunning, 0},
                 Contribution{{}, {}, std::move(running)}, deadline,
                 std::move(done), &ready);
    }
  }
  for (auto& fn : ready) fn();
}

void BnAggregator::Contribute(int worker, BarrierKey key, Contribution c,
                              absl::Time deadline, Done done, Ready* ready) {
  const auto& [layer_name, phase, step] = key;
  if (const int members = Members(key); worker >= members) {
    absl::Status outside = absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker, " is not one of the ", members,
        " workers of step ", step, " (the job was resized)"));
    ready->push_back([done = std::move(done), outside] { done(outside); });
    return;
  }
  Layer& layer = layers_[layer_name];
  auto it = barriers_.find(key);
  if (it == barriers_.end()) {
    auto newest = layer.newest_finished.find(phase);
    if (newest != layer.newest_finished.end() && step <= newest->second) {
      absl::Status past = absl::FailedPreconditionError(absl::StrCat(
          "BN ", PhaseName(static_cast<int>(phase)), " of layer '", layer_name,
          "' step ", step, " is from the past (finished up to step ",
          newest->second, ")"));
      ready->push_back([done = std::move(done), past] { done(past); });
      return;
    }
    it = barriers_.emplace(key, Barrier{}).first;
    it->second.by_worker.resize(options_.num_workers);
  }
  Barrier& b = it->second;
  if (b.result != nullptr) {  // a retry after the barrier finished
    ready->push_back(
        [done = std::move(done), r = ResultFor(b, worker)] { done(*r); });
    return;
  }
  if (!b.by_worker[worker].has_value()) b.by_worker[worker] = std::move(c);
  contributed_[worker] = true;
  b.waiting.emplace_back(worker, std::move(done));
  b.deadline = std::min(b.deadline, deadline);
  Evaluate(key, b, ready);
  if (b.result != nullptr) {
    int64_t& newest = layer.newest_finished[phase];
    newest = std::max(newest, step);
    // Forget barriers of this layer and phase far behind.
    for (auto old = barriers_.lower_bound({layer_name, phase, 0});
         old != barriers_.end() && std::get<0>(old->first) == layer_name &&
         std::get<1>(old->first) == phase &&
         std::get<2>(old->first) < newest - kKeepSteps;) {
      old = old->second.result != nullptr ? barriers_.erase(old) : std::next(old);
    }
  }
}

int BnAggregator::Members(const BarrierKey& key) const {
  if (!options_.workers_at) return options_.num_workers;
  const Phase phase = std::get<1>(key);
  const int64_t step = phase == Phase::kForward || phase == Phase::kBackward
                           ? std::get<2>(key)
                           : std::numeric_limits<int64_t>::max();
  return std::min(options_.workers_at(step), options_.num_workers);
}

std::string BnAggregator::Missing(const BarrierKey& key,
                                  const Barrier& b) const {
  std::vector<int> missing;
  const int members = Members(key);
  for (int w = 0; w < members; ++w) {
    if (live_[w] && !b.by_worker[w].has_value()) missing.push_back(w);
  }
  return absl::StrJoin(missing, ", ");
}

void BnAggregator::Evaluate(const BarrierKey& key, Barrier& b, Ready* ready) {
  if (b.result != nullptr) return;
  const int members = Members(key);
  for (int w = 0; w < members; ++w) {
    if (!live_[w] || b.by_worker[w].has_value()) continue;
    if (!failed_[w].ok()) {
      Resolve(key, b,
              absl::Status(failed_[w].code(),
                           absl::StrCat("BN ", PhaseName(static_cast<int>(std::get<1>(key))),
                                        " of layer '", std::get<0>(key), "' step ",
                                        std::get<2>(key), " needs worker ", w, ": ",
                                        failed_[w].message())),
              ready);
    }
    return;  // still waiting for w
  }
  const absl::Time merge_start = absl::Now();
  absl::StatusOr<Reply> result = Finish(key, b);
  if (result.ok()) result->merge_time = absl::Now() - merge_start;
  Resolve(key, b, std::move(result), ready);
}

void BnAggregator::Resolve(const BarrierKey& key, Barrier& b,
                           absl::StatusOr<Reply> result, Ready* ready) {
  const Phase phase = std::get<1>(key);
  const bool grouped = phase == Phase::kForward || phase == Phase::kBackward;
  if (result.ok() && grouped && options_.group_by_host && !groups_set_) {
    result = absl::FailedPreconditionError(absl::StrCat(
        "BN ", PhaseName(static_cast<int>(phase)), " of layer '",
        std::get<0>(key), "' step ", std::get<2>(key), ": the BN groups "
        "(--bn_group=host) are not known yet: they are fixed once every "
        "worker registered its host with this server"));
  }
  b.result = std::make_shared<const absl::StatusOr<Reply>>(std::move(result));
  if (b.result->ok() && grouped && !group_.empty()) {
    SplitByGroup(key, b, **b.result);
  }
  for (auto& [worker, done] : b.waiting) {
    ready->push_back(
        [done = std::move(done), r = ResultFor(b, worker)] { done(*r); });
  }
  b.waiting.clear();
}

std::shared_ptr<const absl::StatusOr<BnAggregator::Reply>>
BnAggregator::ResultFor(const Barrier& b, int worker) const {
  if (b.by_group.empty()) return b.result;
  return b.by_group[group_[worker]];
}

void BnAggregator::SplitByGroup(const BarrierKey& key, Barrier& b,
                                const Reply& whole) {
  const auto& [layer_name, phase, step] = key;
  const int64_t channels = layers_[layer_name].channels;
  const int groups = *std::max_element(group_.begin(), group_.end()) + 1;
  std::vector<Reply> by_group(groups);
  std::vector<std::vector<const bn::Moments*>> parts(groups);
  for (int g = 0; g < groups; ++g) {
    Reply& r = by_group[g];
    r.group = g;
    r.running = whole.running;  // the job's, whatever the group
    r.merge_time = whole.merge_time;
    if (phase == Phase::kBackward) r.sums = bn::BackwardSums::Zero(channels);
  }
  for (int w = 0; w < options_.num_workers; ++w) {  // worker order
    const auto& c = b.by_worker[w];
    Reply& r = by_group[group_[w]];
    r.contributors += c.has_value();
    if (phase == Phase::kForward) {
      parts[group_[w]].push_back(c.has_value() ? &c->moments : nullptr);
    } else if (c.has_value()) {
      bn::AccumulateSums(c->sums, &r.sums);
    }
  }
  b.by_group.clear();
  for (int g = 0; g < groups; ++g) {
    if (phase == Phase::kForward) {
      by_group[g].moments = bn::MergeInOrder(parts[g], channels);
    }
    b.by_group.push_back(std::make_shared<const absl::StatusOr<Reply>>(
        std::move(by_group[g])));
  }
}

absl::StatusOr<BnAggregator::Reply> BnAggregator::Finish(const BarrierKey& key,
                                                         const Barrier& b) {
  const auto& [layer_name, phase, step] = key;
  Layer& layer = layers_[layer_name];
  Reply reply;
  for (const auto& c : b.by_worker) reply.contributors += c.has_value();
  switch (phase) {
    case Phase::kForward: {
      std::vector<const bn::Moments*> parts;  // worker order: deterministic
      parts.reserve(b.by_worker.size());
      for (const auto& c : b.by_worker) {
        parts.push_back(c.has_value() ? &c->moments : nullptr);
      }
      reply.moments = bn::MergeInOrder(parts, layer.channels);
      if (!layer.running.has_value()) {
        layer.running = bn::RunningStats::Initial(layer.channels);
      }
      if (reply.moments.count >= 2) {
        bn::MixIntoRunningStats(reply.moments, options_.momentum,
                                &*layer.running);
      }
      reply.running = layer.running;
      return reply;
    }
    case Phase::kBackward: {
      reply.sums = bn::BackwardSums::Zero(layer.channels);
      for (const auto& c : b.by_worker) {
        if (!c.has_value()) continue;
        bn::AccumulateSums(c->sums, &reply.sums);
      }
      return reply;
    }
    case Phase::kRecalFinish: {
      if (layer.channels == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "recalibration of BN layer '", layer_name, "' received no batches"));
      }
      std::vector<const bn::Moments*> parts;  // (worker, batch) order
      for (const auto& [id, m] : layer.recal) {
        if (live_[id.first]) parts.push_back(&m);
      }
      reply.moments = bn::MergeInOrder(parts, layer.channels);
      // The batches are merged once: a retry gets this barrier's answer and
      // later batches are refused, so their memory goes back to the workers'
      // budgets (Options::recal_bytes_per_worker).
      int64_t freed = 0;
      for (const auto& [id, m] : layer.recal) {
        recal_bytes_[id.first] -= RecalBytes(m.channels());
        freed += RecalBytes(m.channels());
      }
      if (options_.memory != nullptr) options_.memory->Release(freed);
      layer.recal.clear();
      absl::StatusOr<std::vector<double>> var = bn::UnbiasedVariance(reply.moments);
      if (!var.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "recalibration of BN layer '", layer_name, "': ",
            var.status().message()));
      }
      layer.running = bn::RunningStats{reply.moments.mean, *std::move(var)};
      reply.running = layer.running;
      return reply;
    }
    case Phase::kLocalRunning: {
      bn::RunningStats avg{std::vector<double>(layer.channels, 0.0),
                           std::vector<double>(layer.channels, 0.0)};
      for (const auto& c : b.by_worker) {
        if (!c.has_value()) continue;
        for (int64_t i = 0; i < layer.channels; ++i) {
          avg.mean[i] += c->running.mean[i] / reply.contributors;
          avg.var[i] += c->running.var[i] / reply.contributors;
        }
      }
      layer.running = avg;
      reply.running = std::move(avg);
      return reply;
    }
  }
  return absl::InternalError("unknown BN phase");
}

void BnAggregator::RemoveWorker(int worker) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || worker >= options_.num_workers || !live_[worker]) return;
    live_[worker] = false;
    for (auto& [key, b] : barriers_) Evaluate(key, b, &ready);
    EvaluateWindows(&ready);
  }
  for (auto& fn : ready) fn();
}

void BnAggregator::FailWorker(int worker, absl::Status why) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || worker >= options_.num_workers) return;
    failed_[worker] = std::move(why);
    for (auto& [key, b] : barriers_) Evaluate(key, b, &ready);
    EvaluateWindows(&ready);
  }
  for (auto& fn : ready) fn();
}

void BnAggregator::RestoreWorker(int worker) {
  absl::MutexLock lock(&mu_);
  if (worker < 0 || worker >= options_.num_workers) return;
  live_[worker] = true;
  failed_[worker] = absl::OkStatus();
}

bool BnAggregator::Contributed(int worker) const {
  absl::MutexLock lock(&mu_);
  return worker >= 0 && worker < options_.num_workers && contributed_[worker];
}

bool BnAggregator::AnyContributed() const {
  absl::MutexLock lock(&mu_);
  for (bool c : contributed_) {
    if (c) return true;
  }
  return false;
}

void BnAggregator::ExpireDeadlines(absl::Time now) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, b] : barriers_) {
      if (b.result != nullptr || b.deadline > now) continue;
      Resolve(key, b,
              absl::DeadlineExceededError(absl::StrCat(
                  "BN ", PhaseName(static_cast<int>(std::get<1>(key))),
                  " of layer '", std::get<0>(key), "' step ", std::get<2>(key),
                  " timed out waiting for workers [", Missing(key, b), "]")),
              &ready);
    }
    for (auto& [name, layer] : layers_) {
      if (layer.window != nullptr) {
        layer.window->Expire(now, name, live_, &ready);
      }
    }
  }
  for (auto& fn : ready) fn();
}

std::optional<bn::RunningStats> BnAggregator::Running(
    const std::string& layer) const {
  absl::MutexLock lock(&mu_);
  auto it = layers_.find(layer);
  if (it == layers_.end()) return std::nullopt;
  return it->second.running;
}

int BnAggregator::num_layers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(layers_.size());
}

}  // namespace bnps::server
