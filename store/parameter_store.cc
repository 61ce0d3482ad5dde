#include "store/parameter_store.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "staleness/clock_table.h"
#include "util/cpu_clones.h"

namespace bnps::store {
namespace {

// Optimizer steps of parameters this large run on every core, in blocks of
// kSgdBlock elements.
constexpr size_t kParallelElements = size_t{1} << 16;
constexpr size_t kSgdBlock = size_t{1} << 14;

// The x86-64 baseline (SSE2) does two doubles per instruction, and the step
// computes in double: there it is bound by arithmetic, not memory (about 5 ms
// per 16 MB on one core against 2.3 ms with AVX-512). So the kernel is
// compiled for AVX-512 and AVX2 as well (util/cpu_clones.h). The build keeps
// fused multiply-add off (-ffp-contract=off), so each version does the same
// IEEE operations and gives the same bits.
// One SGD step (momentum, weight decay) of elements [begin, end). The
// gradient of element i is (sum[i] + grad[i]) * scale, where either pointer
// may be null (it adds nothing). w may equal w_in.
BNPS_CPU_CLONES
void SgdRange(const double* sum, const float* grad, const float* w_in,
              float* w, float* buf, size_t begin, size_t end, double scale,
              double lr, double momentum, double decay) {
  auto run = [&](auto gradient) {
    for (size_t i = begin; i < end; ++i) {
      const double d = gradient(i) * scale + decay * w_in[i];
      buf[i] = static_cast<float>(momentum * buf[i] + d);
      w[i] = static_cast<float>(w_in[i] - lr * buf[i]);
    }
  };
  if (sum != nullptr && grad != nullptr) {
    run([&](size_t i) { return sum[i] + grad[i]; });
  } else if (sum != nullptr) {
    run([&](size_t i) { return sum[i]; });
  } else if (grad != nullptr) {
    run([&](size_t i) { return static_cast<double>(grad[i]); });
  } else {
    run([](size_t) { return 0.0; });
  }
}

absl::Status NotInitialized(const std::string& key) {
  return absl::NotFoundError(
      absl::StrCat("parameter '", key, "' was never initialized"));
}

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
  p.shape = std::move(shape);
  p.values = std::make_shared<std::vector<float>>(std::move(values));
  p.last_pushed.assign(options_.num_workers, -1);
  return true;
}

absl::Status ParameterStore::CheckArguments(int worker, int64_t step,
                                            int64_t num_samples) const {
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
  return absl::OkStatus();
}

absl::Status ParameterStore::Admit(const Param& p, int worker, int64_t step,
                                   const std::string& key,
                                   absl::Span<const int64_t> shape,
                                   bool* duplicate) const {
  if (shape != absl::MakeConstSpan(p.shape)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient of '", key, "' has shape [", absl::StrJoin(shape, ","),
        "], the parameter [", absl::StrJoin(p.shape, ","), "]"));
  }
  if (!live_[worker]) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker, " was removed from the job"));
  }
  if (!failed_[worker].ok()) return failed_[worker];
  *duplicate = step <= p.last_pushed[worker];
  if (*duplicate) return absl::OkStatus();
  if (options_.bulk_synchronous) {
    if (const int workers = WorkersAt(step); worker >= workers) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", worker, " is not one of the ", workers,
          " workers of step ", step, " (the job was resized)"));
    }
    if (step < p.version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step, " of '", key, "' is from the past: it was applied ",
          "without worker ", worker, " (now at version ", p.version, ")"));
    }
    if (step > p.version + 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step, " of '", key, "' is from the future: version is ",
          p.version, "; pull before pushing"));
    }
  } else {
    // A worker may begin step c only once every live worker completed c - s
    // steps, so pushed step c - s - 1 here: c <= newest + 1 + s.
    const int64_t next = newest_step_ == INT64_MAX ? INT64_MAX : newest_step_ + 1;
    if (!staleness::Admissible(next, step, options_.staleness)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step, " of '", key, "' is from the future: the newest step ",
          "pushed to this shard is ", newest_step_, " and staleness ",
          options_.staleness, " admits steps up to ",
          next + options_.staleness));  // no overflow: step is beyond it
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterStore::CheckPush(int worker, int64_t step,
                                       const std::string& key,
                                       absl::Span<const int64_t> shape) const {
  if (absl::Status s = CheckArguments(worker, step, 0); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = params_.find(key);
  if (it == params_.end()) return NotInitialized(key);
  bool duplicate;
  return Admit(it->second, worker, step, key, shape, &duplicate);
}

absl::StatusOr<ParameterStore::PushResult> ParameterStore::Push(
    int worker, int64_t step, const std::string& key,
    absl::Span<const int64_t> shape, absl::Span<const float> grad,
    int64_t num_samples) {
  if (absl::Status s = CheckArguments(worker, step, num_samples); !s.ok()) {
    return s;
  }
  Ready ready;
  PushResult result;
  {
    absl::MutexLock lock(&mu_);
    auto it = params_.find(key);
    if (it == params_.end()) return NotInitialized(key);
    Param& p = it->second;
    if (absl::Status s = Admit(p, worker, step, key, shape, &result.duplicate);
        !s.ok()) {
      return s;
    }
    if (grad.size() != p.values->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient of '", key, "' has ", grad.size(), " values, the parameter ",
          p.values->size()));
    }
    if (result.duplicate) {
      ++duplicates_;
      return result;
    }
    newest_step_ = std::max(newest_step_, step);
    // Counted before the update: a step boundary it makes takes the count.
    ++applied_;
    if (options_.bulk_synchronous) {
      const int64_t version = p.version;
      PendingStep& s = p.pending[step];
      if (s.pushed.empty()) s.pushed.assign(options_.num_workers, false);
      s.pushed[worker] = true;
      s.samples += num_samples;
      p.last_pushed[worker] = step;
      if (step == version && Complete(step, s)) {
        // The last push of the step: added inside the optimizer step.
        Apply(p, s.sum.empty() ? nullptr : s.sum.data(), grad.data(),
              s.samples);
        if (!s.sum.empty()) p.spare_sum = std::move(s.sum);
        p.pending.erase(step);
        ApplyReady(p);
        MaybeBoundary(p);
      } else if (s.sum.empty()) {
        // Reusing the last step's buffer avoids fresh pages every step.
        s.sum = std::move(p.spare_sum);
        s.sum.assign(grad.begin(), grad.end());
      } else {
        for (size_t i = 0; i < grad.size(); ++i) s.sum[i] += grad[i];
      }
    } else {
      p.last_pushed[worker] = step;
      Apply(p, nullptr, grad.data(), num_samples);
      MaybeBoundary(p);
    }
    CollectReady(&ready);
  }
  for (auto& fn : ready) fn();
  return result;
}

void ParameterStore::Apply(Param& p, const double* sum, const float* grad,
                           int64_t samples) {
  ++p.version;
  if (p.version > newest_version_.load(std::memory_order_relaxed)) {
    newest_version_.store(p.version, std::memory_order_release);
  }
  if (samples == 0) return;  // nobody had data this step: nothing to learn
  // Pulls still sending the current values keep them; the step writes to
  // another buffer (a pull's earlier one, once it is free).
  std::vector<float>* in = p.values.get();
  if (p.values.use_count() > 1) {
    std::shared_ptr<std::vector<float>> out = std::move(p.spare_values);
    if (out == nullptr || out.use_count() > 1) {
      out = std::make_shared<std::vector<float>>();
    }
    out->resize(in->size());
    p.spare_values = std::move(p.values);
    p.values = std::move(out);
  }
  // A pull that released a buffer we now write was done reading it.
  std::atomic_thread_fence(std::memory_order_acquire);
  const OptimizerOptions& o = options_.optimizer;
  const double scale = 1.0 / static_cast<double>(samples);
  const double lr = o.learning_rate, momentum = o.momentum;
  const double decay = o.weight_decay;
  const float* w_in = in->data();
  float* w = p.values->data();
  float* buf = p.momentum_buffer.data();
  const size_t n = in->size();
  // Elementwise, so splitting into blocks and across threads gives the same
  // bits.
  const bool parallel = n >= kParallelElements;
  const size_t blocks = (n + kSgdBlock - 1) / kSgdBlock;
#pragma omp parallel for schedule(static) if (parallel)
  for (size_t b = 0; b < blocks; ++b) {
    SgdRange(sum, grad, w_in, w, buf, b * kSgdBlock,
             std::min(n, (b + 1) * kSgdBlock), scale, lr, momentum, decay);
  }
}

int ParameterStore::WorkersAt(int64_t step) const {
  return options_.workers_at
             ? std::min(options_.workers_at(step), options_.num_workers)
             : options_.num_workers;
}

bool ParameterStore::Complete(int64_t step, const PendingStep& s) const {
  const int workers = WorkersAt(step);
  for (int w = 0; w < workers; ++w) {
    if (live_[w] && !s.pushed[w]) return false;
  }
  return true;
}

void ParameterStore::ApplyReady(Param& p) {
  for (auto it = p.pending.find(p.version);
       it != p.pending.end() && Complete(it->first, it->second);
       it = p.pending.find(p.version)) {
    PendingStep& s = it->second;
    Apply(p, s.sum.empty() ? nullptr : s.sum.data(), nullptr, s.samples);
    if (!s.sum.empty()) p.spare_sum = std::move(s.sum);
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
    if (p.version < w.min_version) {
      if (absl::Status s = FailedFor(p); !s.ok()) {
        return absl::StatusOr<Snapshot>(s);
      }
      return std::nullopt;
    }
    snap[key] = Tensor{p.shape, p.values, p.version};
  }
  return absl::StatusOr<Snapshot>(std::move(snap));
}

absl::Status ParameterStore::FailedFor(const Param& p) const {
  // The next step to apply waits for live workers that have not pushed.
  auto step = p.pending.find(p.version);
  const int workers = WorkersAt(p.version);
  for (int worker = 0; worker < workers; ++worker) {
    const bool pushed = step != p.pending.end() && step->second.pushed[worker];
    if (live_[worker] && !pushed && !failed_[worker].ok()) {
      return failed_[worker];
    }
  }
  return absl::OkStatus();
}

std::string ParameterStore::MissingWorkers(const Waiter& w) const {
  return MissingWorkers(w.keys, w.min_version);
}

std::string ParameterStore::MissingWorkers(absl::Span<const std::string> keys,
                                           int64_t min_version) const {
  for (const auto& [key, p] : params_) {
    if (!keys.empty() &&
        std::find(keys.begin(), keys.end(), key) == keys.end()) {
      continue;
    }
    if (p.version >= min_version) continue;
    auto step = p.pending.find(p.version);
    std::vector<int> missing;
    const int workers = WorkersAt(p.version);
    for (int worker = 0; worker < workers; ++worker) {
      if (live_[worker] &&
          (step == p.pending.end() || !step->second.pushed[worker])) {
        missing.push_back(worker);
      }
    }
    return absl::StrCat("step ", p.version, " of '", key,
                        "' still waits for workers [",
                        absl::StrJoin(missing, ", "), "]");
  }
  return "no key is behind";
}

void ParameterStore::CollectReady(Ready* ready) {
  util::TakeAnswered(
      &waiters_, [this](const Waiter& w) { return TryPull(w); }, ready);
  std::vector<StreamWaiter> still;
  for (StreamWaiter& w : streams_) {
    const size_t sent = w.sent;
    const bool done = StepStream(w);
    if (done || w.sent > sent) {
      ready->push_back([out = w.out] { out->Drain(); });
    }
    if (!done) still.push_back(std::move(w));
  }
  streams_ = std::move(still);
}

void ParameterStore::PartQueue::Drain() {
  absl::MutexLock lock(&mu);
  if (draining) return;  // that thread hands this part on too
  draining = true;
  while (!parts.empty()) {
    absl::StatusOr<PullPart> part = std::move(parts.front());
    parts.pop_front();
    mu.Unlock();
    done(std::move(part));
    mu.Lock();
  }
  draining = false;
}

bool ParameterStore::StepStream(StreamWaiter& w) {
  PullPart part;
  absl::Status error;
  while (w.sent < w.keys.size()) {
    const std::string& key = w.keys[w.sent];
    auto it = params_.find(key);
    if (it == params_.end()) {  // checked when it came; gone by an Import
      error = absl::NotFoundError(
          absl::StrCat("parameter '", key, "' is not on this shard"));
      break;
    }
    const Param& p = it->second;
    if (p.version < w.min_version) {
      error = FailedFor(p);
      break;
    }
    part.tensors.emplace_back(key, Tensor{p.shape, p.values, p.version});
    ++w.sent;
  }
  const bool last = w.sent == w.keys.size();
  part.last = last;
  absl::MutexLock lock(&w.out->mu);
  if (!part.tensors.empty() || last) w.out->parts.push_back(std::move(part));
  if (!error.ok()) w.out->parts.push_back(error);
  return last || !error.ok();
}

template <typename End>
void ParameterStore::EndStreams(End end, Ready* ready) {
  std::vector<StreamWaiter> still;
  for (StreamWaiter& w : streams_) {
    std::optional<absl::Status> why = end(w);
    if (!why.has_value()) {
      still.push_back(std::move(w));
      continue;
    }
    {
      absl::MutexLock lock(&w.out->mu);
      w.out->parts.push_back(*std::move(why));
    }
    ready->push_back([out = w.out] { out->Drain(); });
  }
  streams_ = std::move(still);
}

void ParameterStore::PullInOrder(std::vector<std::string> keys,
                                 int64_t min_version, absl::Time deadline,
                                 PartDone part) {
  StreamWaiter w{std::move(keys), 0, min_version, deadline,
                 std::make_shared<PartQueue>(std::move(part))};
  {
    absl::MutexLock lock(&mu_);
    absl::Status bad;
    if (w.keys.empty()) {
      for (const auto& [k, _] : params_) w.keys.push_back(k);
    }
    std::set<absl::string_view> seen;
    for (const std::string& key : w.keys) {
      if (!params_.count(key)) {
        bad = absl::NotFoundError(
            absl::StrCat("parameter '", key, "' is not on this shard"));
        break;
      }
      if (!seen.insert(key).second) {
        bad = absl::InvalidArgumentError(
            absl::StrCat("parameter '", key, "' is asked for twice"));
        break;
      }
    }
    if (!bad.ok()) {
      absl::MutexLock out(&w.out->mu);
      w.out->parts.push_back(bad);
    } else if (!StepStream(w)) {
      streams_.push_back(w);  // keeps a reference to the queue
    }
  }
  w.out->Drain();
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
    for (auto& [_, p] : params_) {
      ApplyReady(p);
      MaybeBoundary(p);
    }
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

void ParameterStore::RestoreWorker(int worker) {
  absl::MutexLock lock(&mu_);
  if (worker < 0 || worker >= options_.num_workers) return;
  live_[worker] = true;
  failed_[worker] = absl::OkStatus();
}

int64_t ParameterStore::NextStep(int worker) const {
  absl::MutexLock lock(&mu_);
  int64_t next = INT64_MAX;
  if (worker < 0 || worker >= options_.num_workers) return next;
  for (const auto& [_, p] : params_) {
    next = std::min(next, p.last_pushed[worker] + 1);
  }
  return next;
}

bool ParameterStore::Pushed(int worker) const {
  absl::MutexLock lock(&mu_);
  if (worker < 0 || worker >= options_.num_workers) return false;
  for (const auto& [_, p] : params_) {
    if (p.last_pushed[worker] >= 0) return true;
  }
  return false;
}

void ParameterStore::ExpireDeadlines(absl::Time now) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    util::TakeAnswered(
        &waiters_,
        [&](const Waiter& w) -> std::optional<absl::StatusOr<Snapshot>> {
          if (w.deadline > now) return std::nullopt;
          return absl::DeadlineExceededError(
              absl::StrCat("pull of version ", w.min_version,
                           " timed out: ", MissingWorkers(w)));
        },
        &ready);
    EndStreams(
        [&](const StreamWaiter& w) -> std::optional<absl::Status> {
          if (w.deadline > now) return std::nullopt;
          // The first key it waits for holds back the rest.
          return absl::DeadlineExceededError(absl::StrCat(
              "pull of version ", w.min_version, " timed out: ",
              MissingWorkers(absl::MakeConstSpan(&w.keys[w.sent], 1),
                             w.min_version)));
        },
        &ready);
  }
  for (auto& fn : ready) fn();
}

void ParameterStore::MaybeBoundary(const Param& p) {
  const int64_t every = options_.boundary_every;
  if (every <= 0 || !options_.on_boundary) return;
  const int64_t k = options_.bulk_synchronous
                        ? p.version
                        : newest_version_.load(std::memory_order_relaxed);
  if (k <= last_boundary_ || k % every != 0) return;
  if (options_.bulk_synchronous) {
    for (const auto& [_, q] : params_) {
      if (q.version != k) return;
    }
  }
  last_boundary_ = k;
  options_.on_boundary(k, ExportLocked());
}

StoreState ParameterStore::ExportLocked() const {
  StoreState state;
  for (const auto& [key, p] : params_) {
    state.keys.push_back(StoreState::Key{key, p.shape, p.values,
                                         p.momentum_buffer, p.version,
                                         p.last_pushed});
  }
  state.applied = applied_;
  state.duplicates = duplicates_;
  state.newest_step = newest_step_;
  return state;
}

StoreState ParameterStore::Export() const {
  absl::MutexLock lock(&mu_);
  return ExportLocked();
}

absl::Status ParameterStore::Import(const StoreState& state,
                                    const absl::Status& why) {
  std::map<std::string, Param> params;
  int64_t newest = 0;
  for (const StoreState::Key& k : state.keys) {
    if (k.values == nullptr ||
        Product(k.shape) != static_cast<int64_t>(k.values->size()) ||
        k.momentum.size() != k.values->size() ||
        k.last_pushed.size() != static_cast<size_t>(options_.num_workers) ||
        k.version < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpointed parameter '", k.key, "' does not fit this job"));
    }
    Param& p = params[k.key];
    p.shape = k.shape;
    p.values = std::make_shared<std::vector<float>>(*k.values);
    p.momentum_buffer = k.momentum;
    p.version = k.version;
    p.last_pushed = k.last_pushed;
    newest = std::max(newest, k.version);
  }
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    params_ = std::move(params);
    applied_ = state.applied;
    duplicates_ = state.duplicates;
    newest_step_ = state.newest_step;
    last_boundary_ = newest;
    newest_version_.store(newest, std::memory_order_release);
    util::TakeAnswered(
        &waiters_,
        [&](const Waiter&) -> std::optional<absl::StatusOr<Snapshot>> {
          return absl::StatusOr<Snapshot>(why);
        },
        &ready);
    EndStreams([&](const StreamWaiter&) { return std::optional(why); },
               &ready);
  }
  for (auto& fn : ready) fn();
  return absl::OkStatus();
}

ParameterStore::Stats ParameterStore::GetStats() const {
  absl::MutexLock lock(&mu_);
  Stats s;
  s.num_keys = static_cast<int>(params_.size());
  s.min_version = params_.empty() ? 0 : INT64_MAX;
  for (const auto& [_, p] : params_) {
    s.min_version = std::min(s.min_version, p.version);
    s.num_values += static_cast<int64_t>(p.values->size());
  }
  s.applied = applied_;
  s.duplicates = duplicates_;
  return s;
}

}  // namespace bnps::store
