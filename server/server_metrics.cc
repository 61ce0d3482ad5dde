#include "server/server_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace bnps::server {
namespace {

constexpr int kNumCodes = 17;

int CodeIndex(absl::StatusCode code) {
  const int c = static_cast<int>(code);
  return c >= 0 && c < kNumCodes ? c : static_cast<int>(absl::StatusCode::kUnknown);
}

// The child of `family` for `values`, made once and kept in `slot`.
metrics::Counter* Lazy(std::atomic<metrics::Counter*>& slot,
                       metrics::Family<metrics::Counter>* family,
                       const metrics::LabelValues& values) {
  metrics::Counter* c = slot.load(std::memory_order_acquire);
  if (c == nullptr) {
    c = family->WithLabels(values);  // the same child for racing callers
    slot.store(c, std::memory_order_release);
  }
  return c;
}

void AtomicMax(std::atomic<int64_t>& a, int64_t v) {
  int64_t old = a.load(std::memory_order_relaxed);
  while (v > old &&
         !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
  }
}

// 50 us to about 45 s: a barrier waits for the slowest worker's step.
const std::vector<double> kWaitBuckets = metrics::ExponentialBuckets(5e-5, 2.5, 16);
// 1 us to about 1.6 s.
const std::vector<double> kMergeBuckets = metrics::ExponentialBuckets(1e-6, 3, 14);
const std::vector<double> kStalenessBuckets = {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64};

}  // namespace

const char* ServerMetrics::MethodName(Method m) {
  static const char* const kNames[kNumMethods] = {
      "Register", "Heartbeat", "InitParameters", "PushGradients",
      "PullParameters", "BnSync", "StartStep", "FinishStep", "GetStatus",
      "Rollback", "GetDigest", "Leave", "ReadState", "Session"};
  return kNames[m];
}

const char* ServerMetrics::PhaseName(BnPhase p) {
  static const char* const kNames[kNumBnPhases] = {
      "forward", "backward", "recal", "recal_finish", "local_running", "running"};
  return kNames[p];
}

ServerMetrics::ServerMetrics(metrics::Registry* registry, Shard* shard)
    : registry_(registry), shard_(shard) {
  metrics::Registry& r = *registry;
  requests_family_ = r.AddCounter(
      "bnps_server_requests_total",
      "Calls of the ParameterServer service that ended, by method and gRPC "
      "status code (a BnSync stream counts once, when it ends).",
      {"method", "code"});
  metrics::Family<metrics::Counter>* received = r.AddCounter(
      "bnps_server_received_bytes_total",
      "Bytes of request messages received, by method.", {"method"});
  metrics::Family<metrics::Counter>* sent = r.AddCounter(
      "bnps_server_sent_bytes_total",
      "Bytes of response messages sent, by method.", {"method"});
  for (int m = 0; m < kNumMethods; ++m) {
    received_[m] = received->WithLabels({MethodName(static_cast<Method>(m))});
    sent_[m] = sent->WithLabels({MethodName(static_cast<Method>(m))});
  }
  metrics::Family<metrics::Counter>* pushes = r.AddCounter(
      "bnps_server_pushes_total",
      "Gradient tensors pushed: applied, or duplicate (a retry of a push "
      "already applied, ignored).",
      {"result"});
  applied_ = pushes->WithLabels({"applied"});
  duplicate_ = pushes->WithLabels({"duplicate"});
  push_rejected_family_ = r.AddCounter(
      "bnps_server_push_rejections_total",
      "Gradient pushes refused, by reason (the status code returned).",
      {"reason"});
  bn_rejected_family_ = r.AddCounter(
      "bnps_server_bn_rejections_total",
      "BN messages refused, by reason (the status code returned).", {"reason"});
  wait_family_ = r.AddHistogram(
      "bnps_server_bn_barrier_wait_seconds",
      "Time from a BN message's arrival to its answer, by layer and phase: "
      "under sync, how long this worker waited for the others (and the merge).",
      {"layer", "phase"}, kWaitBuckets);
  merge_family_ = r.AddHistogram(
      "bnps_server_bn_merge_seconds",
      "Time to compute a completed BN barrier's merge, by layer and phase.",
      {"layer", "phase"}, kMergeBuckets);
  staleness_ = r.AddHistogram(
                    "bnps_server_bn_staleness_steps",
                    "async: for each other worker's moments merged into a "
                    "forward answer, the asking step minus their step.",
                    {}, kStalenessBuckets)
                   ->WithLabels({});
  AddGroupWaits(shard->options());
  metrics::Family<metrics::Gauge>* workers = r.AddGauge(
      "bnps_server_workers",
      "Workers of the job by state on this shard: live, lost (silent past "
      "the heartbeat timeout, or dropped), unregistered.",
      {"state"});
  live_ = workers->WithLabels({"live"});
  lost_ = workers->WithLabels({"lost"});
  unregistered_ = workers->WithLabels({"unregistered"});
  metrics::Family<metrics::Gauge>* steps = r.AddGauge(
      "bnps_server_worker_step",
      "The newest step a push or BN message of the worker named; -1 before any.",
      {"worker"});
  const int n = shard->options().num_workers;
  worker_steps_.reset(new std::atomic<int64_t>[n]);
  worker_pushes_.reset(new std::atomic<int64_t>[n]);
  for (int w = 0; w < n; ++w) {
    worker_steps_[w].store(-1);
    worker_pushes_[w].store(0);
    worker_step_gauges_.push_back(steps->WithLabels({absl::StrCat(w)}));
  }
  version_ = r.AddGauge("bnps_server_parameter_version",
                        "The oldest version of this shard's parameters (steps "
                        "applied).")
                 ->WithLabels({});
  checkpoint_age_family_ = r.AddGauge(
      "bnps_server_checkpoint_age_seconds",
      "Seconds since this shard last wrote a checkpoint; absent before the "
      "first.");
  r.AddCollector([this] { Collect(); });
}

void ServerMetrics::AddGroupWaits(const ShardOptions& o) {
  if (o.bn_group_size == 0 && !o.bn_group_by_host) return;
  group_wait_family_ = registry_->AddHistogram(
      "bnps_server_bn_group_barrier_wait_seconds",
      "With BN groups (--bn_group_size, --bn_group=host): time from a BN "
      "forward or backward barrier message's arrival to its answer, by the "
      "sender's group and phase, over all layers.",
      {"group", "phase"}, kWaitBuckets);
  group_wait_.reset(new std::atomic<metrics::Histogram*>[2 * o.num_workers]);
  for (int i = 0; i < 2 * o.num_workers; ++i) group_wait_[i].store(nullptr);
}

void ServerMetrics::GroupWait(int group, BnPhase phase, absl::Duration wait) {
  if (group_wait_family_ == nullptr || group < 0 ||
      group >= shard_->options().num_workers ||
      (phase != kForward && phase != kBackward)) {
    return;
  }
  std::atomic<metrics::Histogram*>& slot =
      group_wait_[2 * group + (phase == kBackward)];
  metrics::Histogram* h = slot.load(std::memory_order_acquire);
  if (h == nullptr) {
    // Racing callers get the same child from the family.
    h = group_wait_family_->WithLabels({absl::StrCat(group), PhaseName(phase)});
    slot.store(h, std::memory_order_release);
  }
  h->Observe(absl::ToDoubleSeconds(wait));
}

void ServerMetrics::Request(Method m, absl::StatusCode code) {
  const int c = CodeIndex(code);
  Lazy(requests_[m][c], requests_family_,
       {MethodName(m), absl::StatusCodeToString(static_cast<absl::StatusCode>(c))})
      ->Increment();
}

void ServerMetrics::PushApplied(int worker) {
  applied_->Increment();
  if (worker >= 0 && worker < shard_->options().num_workers) {
    worker_pushes_[worker].fetch_add(1, std::memory_order_relaxed);
  }
}

void ServerMetrics::PushRejected(absl::StatusCode code) {
  const int c = CodeIndex(code);
  Lazy(push_rejected_[c], push_rejected_family_,
       {absl::StatusCodeToString(static_cast<absl::StatusCode>(c))})
      ->Increment();
}

void ServerMetrics::BnRejected(absl::StatusCode code) {
  const int c = CodeIndex(code);
  Lazy(bn_rejected_[c], bn_rejected_family_,
       {absl::StatusCodeToString(static_cast<absl::StatusCode>(c))})
      ->Increment();
}

void ServerMetrics::WorkerAt(int worker, int64_t step) {
  if (worker >= 0 && worker < shard_->options().num_workers) {
    AtomicMax(worker_steps_[worker], step);
  }
}

int64_t ServerMetrics::worker_step(int worker) const {
  if (worker < 0 || worker >= shard_->options().num_workers) return -1;
  return worker_steps_[worker].load(std::memory_order_relaxed);
}

int64_t ServerMetrics::worker_pushes(int worker) const {
  if (worker < 0 || worker >= shard_->options().num_workers) return 0;
  return worker_pushes_[worker].load(std::memory_order_relaxed);
}

ServerMetrics::Layer::Layer(const ServerMetrics* owner, std::string label)
    : owner_(owner), label_(std::move(label)) {
  step_.fill(-1);
  slowest_.fill(0);
}

ServerMetrics::Layer::Phase& ServerMetrics::Layer::Resolve(BnPhase phase) {
  Phase& p = phases_[phase];
  if (p.wait.load(std::memory_order_acquire) == nullptr) {
    // Racing callers get the same children from the families.
    p.merge.store(owner_->merge_family_->WithLabels({label_, PhaseName(phase)}),
                  std::memory_order_release);
    p.wait.store(owner_->wait_family_->WithLabels({label_, PhaseName(phase)}),
                 std::memory_order_release);
  }
  return p;
}

void ServerMetrics::Layer::Observe(BnPhase phase, int64_t step,
                                   absl::Duration wait, absl::Duration merge) {
  Phase& p = Resolve(phase);
  const double w = absl::ToDoubleSeconds(wait);
  p.wait.load(std::memory_order_acquire)->Observe(w);
  if (merge > absl::ZeroDuration()) {
    p.merge.load(std::memory_order_acquire)->Observe(absl::ToDoubleSeconds(merge));
  }
  absl::MutexLock lock(&mu_);
  if (step > step_[phase]) {
    step_[phase] = step;
    slowest_[phase] = w;
  } else if (step == step_[phase]) {
    slowest_[phase] = std::max(slowest_[phase], w);
  }
}

ServerMetrics::Layer* ServerMetrics::ForLayer(const std::string& layer) {
  absl::MutexLock lock(&mu_);
  auto it = layers_.find(layer);
  if (it != layers_.end()) return it->second.get();
  const bool own =
      layers_.size() < kMaxLayers && layer.size() <= kMaxLayerNameBytes;
  const std::string key = own ? layer : "(other)";
  std::unique_ptr<Layer>& l = layers_[key];
  if (l == nullptr) l.reset(new Layer(this, key));
  return l.get();
}

std::vector<ServerMetrics::LayerSummary> ServerMetrics::Layers() const {
  std::vector<LayerSummary> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, l] : layers_) {
    for (BnPhase phase : {kForward, kBackward}) {
      metrics::Histogram* h = l->phases_[phase].wait.load(std::memory_order_acquire);
      if (h == nullptr) continue;
      const metrics::Histogram::Snapshot s = h->Read();
      LayerSummary sum;
      sum.layer = name;
      sum.phase = phase;
      sum.messages = static_cast<int64_t>(s.count);
      sum.mean_wait_seconds = s.count > 0 ? s.sum / s.count : 0;
      absl::MutexLock layer_lock(&l->mu_);
      sum.step = l->step_[phase];
      sum.slowest_wait_seconds = l->slowest_[phase];
      out.push_back(std::move(sum));
    }
  }
  return out;
}

ServerMetrics::Layer* ServerMetrics::LayerCache::Get(const std::string& layer) {
  auto it = layers_.find(layer);
  if (it != layers_.end()) return it->second;
  Layer* l = metrics_->ForLayer(layer);
  const int64_t bytes = kEntryBytes + static_cast<int64_t>(layer.size());
  if (layers_.size() < static_cast<size_t>(kMaxLayers) &&
      charged_ + bytes <= kMaxBytes &&
      (budget_ == nullptr || budget_->TryChargeLasting(bytes))) {
    layers_.emplace(layer, l);
    charged_ += bytes;
  }
  return l;
}

void ServerMetrics::FillStatus(proto::StatusResponse* status) const {
  for (int w = 0; w < status->workers_size(); ++w) {
    proto::WorkerStatus* ws = status->mutable_workers(w);
    ws->set_step(worker_step(ws->worker()));
    ws->set_pushes(worker_pushes(ws->worker()));
  }
  for (const LayerSummary& l : Layers()) {
    proto::BnLayerStatus* ls = status->add_bn_layers();
    ls->set_layer(l.layer);
    ls->set_phase(static_cast<proto::BnPhase>(l.phase + proto::BN_FORWARD));
    ls->set_messages(l.messages);
    ls->set_mean_wait_seconds(l.mean_wait_seconds);
    ls->set_step(l.step);
    ls->set_slowest_wait_seconds(l.slowest_wait_seconds);
  }
}

void ServerMetrics::RecordCheckpoint(absl::Time when) {
  checkpoint_age_family_->WithLabels({});  // exposed from now on
  absl::MutexLock lock(&mu_);
  checkpoint_ = when;
}

void ServerMetrics::Collect() {
  int live = 0, lost = 0, unregistered = 0;
  for (const Membership::WorkerInfo& w : shard_->membership().Snapshot()) {
    if (!w.registered) {
      ++unregistered;
    } else if (w.lost) {
      ++lost;
    } else {
      ++live;
    }
  }
  live_->Set(live);
  lost_->Set(lost);
  unregistered_->Set(unregistered);
  for (size_t w = 0; w < worker_step_gauges_.size(); ++w) {
    worker_step_gauges_[w]->Set(static_cast<double>(worker_step(w)));
  }
  version_->Set(static_cast<double>(shard_->store().GetStats().min_version));
  if (std::optional<absl::Time> t = shard_->last_checkpoint_written()) {
    RecordCheckpoint(*t);
  }
  std::optional<absl::Time> checkpoint;
  {
    absl::MutexLock lock(&mu_);
    checkpoint = checkpoint_;
  }
  if (checkpoint.has_value()) {
    checkpoint_age_family_->WithLabels({})->Set(
        absl::ToDoubleSeconds(shard_->options().now() - *checkpoint));
  }
}

}  // namespace bnps::server
