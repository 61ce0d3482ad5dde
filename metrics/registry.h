// Metrics of one process (counters, gauges, histograms, with labels) and
// their Prometheus text exposition (format 0.0.4).
//
// A Registry owns families; a family owns one child per set of label values.
// Callers resolve the children they need once (Family::WithLabels) and keep the
// pointer: an observation is then a few relaxed atomic operations, with no
// lock, no allocation and no lookup. Children live as long as the registry.
//
// There is no process-wide registry: whoever builds a server or a worker
// makes one and passes it down (server/server_metrics.h, worker/
// worker_metrics.h), and an HTTP endpoint (metrics/http_endpoint.h) serves it.
//
// Example:
//   metrics::Registry registry;
//   metrics::Family<metrics::Counter>* pushes = registry.AddCounter(
//       "bnps_server_pushes_total", "Tensors pushed.", {"result"});
//   metrics::Counter* applied = pushes->WithLabels({"applied"});
//   applied->Increment();
//   std::string text = registry.TextExposition();
//
// Names follow Prometheus's rules ([a-zA-Z_:][a-zA-Z0-9_:]*, labels without
// ':' and not starting with "__"); registering a bad or duplicate name, a
// child with the wrong number of label values, or buckets that are not
// increasing is a programming error and aborts with a message.
//
// Thread-safety: thread-safe. Observations may race with an exposition; each
// series is then read as of some moment (a histogram's count is the sum of
// its buckets, so _count always equals the +Inf bucket).

#ifndef BNPS_METRICS_REGISTRY_H_
#define BNPS_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace bnps::metrics {

// The label values of one child, in the order of its family's label names.
using LabelValues = std::vector<std::string>;

// A monotonic count (an integer: events, bytes).
class Counter {
 public:
  // REQUIRES: n >= 0.
  void Increment(int64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  int64_t Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double d);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Counts observations into buckets with fixed upper bounds (the last bucket,
// +Inf, is implicit), and their sum.
class Histogram {
 public:
  // `bounds` strictly increasing and finite.
  explicit Histogram(const std::vector<double>* bounds);

  void Observe(double v);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;
  const std::vector<double>& bounds() const { return *bounds_; }

 private:
  const std::vector<double>* const bounds_;  // the family's
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds + 1
  std::atomic<double> sum_{0};
};

// Bucket bounds: `count` bounds start, start*factor, start*factor^2, ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// `count` bounds start, start+width, ...
std::vector<double> LinearBuckets(double start, double width, int count);

// All children of one metric name.
template <typename T>
class Family {
 public:
  // The child of `values` (one per label name), created on first use. The
  // pointer stays valid while the registry lives: keep it.
  T* WithLabels(const LabelValues& values);

  const std::string& name() const { return name_; }

 private:
  friend class Registry;
  Family(std::string name, std::string help, std::vector<std::string> labels,
         std::vector<double> bounds = {})
      : name_(std::move(name)),
        help_(std::move(help)),
        labels_(std::move(labels)),
        bounds_(std::move(bounds)) {}
  std::unique_ptr<T> Make() const;
  // Appends this family's exposition to `out`.
  void Write(std::string* out) const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> labels_;
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<LabelValues, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The family pointers stay valid while the registry lives. A counter's name
  // should end in _total; the exposition writes the names as given.
  Family<Counter>* AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> labels = {});
  Family<Gauge>* AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> labels = {});
  Family<Histogram>* AddHistogram(const std::string& name,
                                  const std::string& help,
                                  std::vector<std::string> labels,
                                  std::vector<double> bounds);

  // Runs `collect` at the start of every exposition, e.g. to set gauges from
  // state that is read rather than counted (live workers). It must not call
  // TextExposition. The registry keeps it; whatever it captures must outlive
  // every later exposition.
  void AddCollector(std::function<void()> collect);

  // Every family, in registration order, in the text format.
  std::string TextExposition() const;

 private:
  void CheckNew(const std::string& name, const std::vector<std::string>& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Family<Counter>>> counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Family<Gauge>>> gauges_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Family<Histogram>>> histograms_
      ABSL_GUARDED_BY(mu_);
  // Exposition order: (kind, index into that kind's vector).
  std::vector<std::pair<int, size_t>> order_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

// Text-format helpers, exposed for tests.
// A sample value: shortest round-trip decimal, "+Inf", "-Inf" or "NaN".
std::string FormatValue(double v);
// A label value with \, " and newline escaped.
std::string EscapeLabelValue(const std::string& v);
// HELP text with \ and newline escaped.
std::string EscapeHelp(const std::string& v);

}  // namespace bnps::metrics

#endif  // BNPS_METRICS_REGISTRY_H_
