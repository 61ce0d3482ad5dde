#include "server/parameter_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace bnps::server {
namespace {

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

ParameterStore::ParameterStore(Options options)
    : options_(options),
      live_(options.num_workers, true),
      failed_(options.num_workers) {}

absl::StatusOr<bool> ParameterStore::Init(const std::string& key,
                                          std::vector<int64_t> shape,
                                          std::vector<float> values) {
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError("negative dimension");
  }
  if (Product(shape) != static_cast<int64_t>(values.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", key, "': ", values.size(), " values for ",
        Product(shape), " elements"));
  }
  absl::MutexLock lock(&mu_);
  if (params_.count(key) > 0) return false;
  Param& p = params_[key];
  p.momentum_buffer.assign(values.size(), 0.0f);
  p.tensor.shape = std::move(shape);
  p.tensor.values = std::move(values);
  p.last_pushed.assign(options_.num_workers, -1);
  return true;
}

absl::StatusOr<ParameterStore::PushResult> ParameterStore::Push(
    int worker, int64_t step, const std::string& key,
    const std::vector<int64_t>& shape, const std::vector<float>& grad,
    int64_t num_samples) {
  if (worker < 0 || worker >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " outside the job's [0, ", options_.num_workers, ")"));
  }
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative step ", step));
  }
  if (num_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative sample count ", num_samples));
  }
  Ready ready;
  PushResult result;
  {
    absl::MutexLock lock(&mu_);
    auto it = params_.find(key);
    if (it == params_.end()) {
      return absl::NotFoundError(
          absl::StrCat("parameter '", key, "' was never initialized"));
    }
    Param& p = it->second;
    if (shape != p.tensor.shape || grad.size() != p.tensor.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient of '", key, "' has shape [", absl::StrJoin(shape, ","),
          "], the parameter [", absl::StrJoin(p.tensor.shape, ","), "]"));
    }
    if (!live_[worker]) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", worker, " was removed from the job"));
    }
    if (step <= p.last_pushed[worker]) {
      ++duplicates_;
      result.duplicate = true;
      return result;
    }
    if (options_.bulk_synchronous) {
      const int64_t version = p.tensor.version;
      if (step < version) {
        return absl::FailedPreconditionError(absl::StrCat(
            "step ", step, " of '", key, "' is from the past: it was applied ",
            "without worker ", worker, " (now at version ", version, ")"));
      }
      if (step > version + 1) {
        return absl::FailedPreconditionError(absl::StrCat(
            "step ", step, " of '", key, "' is from the future: version is ",
            version, "; pull before pushing"));
      }
      PendingStep& s = p.pending[step];
      if (s.pushed.empty()) {
        s.pushed.assign(options_.num_workers, false);
        // Reusing the last step's buffer avoids fresh pages every step.
        s.sum = std::move(p.spare_sum);
        s.sum.assign(grad.size(), 0.0);
      }
      s.pushed[worker] = true;
      for (size_t i = 0; i < grad.size(); ++i) s.sum[i] += grad[i];
      s.samples += num_samples;
      p.last_pushed[worker] = step;
      ApplyReady(p);
    } else {
      std::vector<double> g(grad.begin(), grad.end());
      p.last_pushed[worker] = step;
      Apply(p, g, num_samples);
    }
    ++applied_;
    CollectReady(&ready);
  }
  for (auto& fn : ready) fn();
  return result;
}

void ParameterStore::Apply(Param& p, const std::vector<double>& grad_sum,
                           int64_t samples) {
  ++p.tensor.version;
  if (samples == 0) return;  // nobody had data this step: nothing to learn
  const OptimizerOptions& o = options_.optimizer;
  const double scale = 1.0 / static_cast<double>(samples);
  std::vector<float>& w = p.tensor.values;
  std::vector<float>& buf = p.momentum_buffer;
  for (size_t i = 0; i < w.size(); ++i) {
    const double d = grad_sum[i] * scale + o.weight_decay * w[i];
    buf[i] = static_cast<float>(o.momentum * buf[i] + d);
    w[i] = static_cast<float>(w[i] - o.learning_rate * buf[i]);
  }
}

bool ParameterStore::Complete(const PendingStep& s) const {
  for (int w = 0; w < options_.num_workers; ++w) {
    if (live_[w] && !s.pushed[w]) return false;
  }
  return true;
}

void ParameterStore::ApplyReady(Param& p) {
  for (auto it = p.pending.find(p.tensor.version);
       it != p.pending.end() && Complete(it->second);
       it = p.pending.find(p.tensor.version)) {
    Apply(p, it->second.sum, it->second.samples);
    p.spare_sum = std::move(it->second.sum);
    p.pending.erase(it);
  }
}

std::optional<absl::StatusOr<ParameterStore::Snapshot>> ParameterStore::TryPull(
    const Waiter& w) const {
  std::vector<std::string> all;
  if (w.keys.empty()) {
    for (const auto& [k, _] : params_) all.push_back(k);
  }
  const std::vector<std::string>& want = w.keys.empty() ? all : w.keys;
  Snapshot snap;
  for (const std::string& key : want) {
    auto it = params_.find(key);
    if (it == params_.end()) {
      return absl::StatusOr<Snapshot>(
          absl::NotFoundError(absl::StrCat("parameter '", key, "' is not on this shard")));
    }
    const Param& p = it->second;
    if (p.tensor.version < w.min_version) {
      // The next step to apply waits for live workers that have not pushed.
      auto step = p.pending.find(p.tensor.version);
      for (int worker = 0; worker < options_.num_workers; ++worker) {
        const bool pushed =
            step != p.pending.end() && step->second.pushed[worker];
        if (live_[worker] && !pushed && !failed_[worker].ok()) {
          return absl::StatusOr<Snapshot>(failed_[worker]);
        }
      }
      return std::nullopt;
    }
    snap[key] = p.tensor;
  }
  return absl::StatusOr<Snapshot>(std::move(snap));
}

std::string ParameterStore::MissingWorkers(const Waiter& w) const {
  for (const auto& [key, p] : params_) {
    if (!w.keys.empty() &&
        std::find(w.keys.begin(), w.keys.end(), key) == w.keys.end()) {
      continue;
    }
    if (p.tensor.version >= w.min_version) continue;
    auto step = p.pending.find(p.tensor.version);
    std::vector<int> missing;
    for (int worker = 0; worker < options_.num_workers; ++worker) {
      if (live_[worker] &&
          (step == p.pending.end() || !step->second.pushed[worker])) {
        missing.push_back(worker);
      }
    }
    return absl::StrCat("step ", p.tensor.version, " of '", key,
                        "' still waits for workers [",
                        absl::StrJoin(missing, ", "), "]");
  }
  return "no key is behind";
}

void ParameterStore::CollectReady(Ready* ready) {
  std::vector<Waiter> still;
  for (Waiter& w : waiters_) {
    std::optional<absl::StatusOr<Snapshot>> r = TryPull(w);
    if (!r.has_value()) {
      still.push_back(std::move(w));
      continue;
    }
    ready->push_back([done = std::move(w.done), r = *std::move(r)]() mutable {
      done(std::move(r));
    });
  }
  waiters_ = std::move(still);
}

void ParameterStore::Pull(std::vector<std::string> keys, int64_t min_version,
                          absl::Time deadline, PullDone done) {
  Waiter w{std::move(keys), min_version, deadline, std::move(done)};
  std::optional<absl::StatusOr<Snapshot>> r;
  {
    absl::MutexLock lock(&mu_);
    r = TryPull(w);
    if (!r.has_value()) {
      waiters_.push_back(std::move(w));
      return;
    }
  }
  w.done(*std::move(r));
}

void ParameterStore::RemoveWorker(int worker) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || worker >= options_.num_workers || !live_[worker]) return;
    live_[worker] = false;
    for (auto& [_, p] : params_) ApplyReady(p);
    CollectReady(&ready);
  }
  for (auto& fn : ready) fn();
}

void ParameterStore::FailWorker(int worker, absl::Status why) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || worker >= options_.num_workers) return;
    failed_[worker] = std::move(why);
    CollectReady(&ready);
  }
  for (auto& fn : ready) fn();
}

void ParameterStore::ExpireDeadlines(absl::Time now) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Waiter> still;
    for (Waiter& w : waiters_) {
      if (w.deadline > now) {
        still.push_back(std::move(w));
        continue;
      }
      absl::Status s = absl::DeadlineExceededError(absl::StrCat(
          "pull of version ", w.min_version, " timed out: ", MissingWorkers(w)));
      ready.push_back([done = std::move(w.done), s]() { done(s); });
    }
    waiters_ = std::move(still);
  }
  for (auto& fn : ready) fn();
}

ParameterStore::Stats ParameterStore::GetStats() const {
  absl::MutexLock lock(&mu_);
  Stats s;
  s.num_keys = static_cast<int>(params_.size());
  s.min_version = params_.empty() ? 0 : INT64_MAX;
  for (const auto& [_, p] : params_) {
    s.min_version = std::min(s.min_version, p.tensor.version);
  }
  s.applied = applied_;
  s.duplicates = duplicates_;
  return s;
}

}  // namespace bnps::server
