#include "metrics/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace bnps::metrics {
namespace {

enum Kind { kCounter = 0, kGauge = 1, kHistogram = 2 };

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bnps metrics: %s\n", what.c_str());
  std::abort();
}

bool ValidName(const std::string& name, bool label) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       c == '_' || (!label && c == ':');
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return !(label && name.rfind("__", 0) == 0);
}

// `{a="x",b="y"}` of a child, with `extra` (le="...") appended; empty
// without labels.
std::string LabelText(const std::vector<std::string>& names,
                      const LabelValues& values, const std::string& extra = "") {
  if (names.empty() && extra.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (!extra.empty()) {
    if (!names.empty()) out += ',';
    out += extra;
  }
  out += '}';
  return out;
}

void WriteHeader(const std::string& name, const std::string& help,
                 const char* type, std::string* out) {
  absl::StrAppend(out, "# HELP ", name, " ", EscapeHelp(help), "\n", "# TYPE ",
                  name, " ", type, "\n");
}

}  // namespace

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void Gauge::Add(double d) {
  double old = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(old, old + d, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds),
      counts_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds->size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double v) {
  // Buckets are few (about 20): a linear scan beats a binary search's
  // branches for the small values that are most common.
  const std::vector<double>& b = *bounds_;
  size_t i = 0;
  while (i < b.size() && v > b[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  double old = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.cumulative.resize(bounds_->size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i) b.push_back(start + i * width);
  return b;
}

template <typename T>
T* Family<T>::WithLabels(const LabelValues& values) {
  if (values.size() != labels_.size()) {
    Die(absl::StrCat(name_, ": ", values.size(), " label values for ",
                     labels_.size(), " labels"));
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<T>& child = children_[values];
  if (child == nullptr) child = Make();
  return child.get();
}

template <>
std::unique_ptr<Counter> Family<Counter>::Make() const {
  return std::make_unique<Counter>();
}
template <>
std::unique_ptr<Gauge> Family<Gauge>::Make() const {
  return std::make_unique<Gauge>();
}
template <>
std::unique_ptr<Histogram> Family<Histogram>::Make() const {
  return std::make_unique<Histogram>(&bounds_);
}

template <>
void Family<Counter>::Write(std::string* out) const {
  WriteHeader(name_, help_, "counter", out);
  absl::MutexLock lock(&mu_);
  for (const auto& [values, c] : children_) {
    absl::StrAppend(out, name_, LabelText(labels_, values), " ", c->Value(),
                    "\n");
  }
}

template <>
void Family<Gauge>::Write(std::string* out) const {
  WriteHeader(name_, help_, "gauge", out);
  absl::MutexLock lock(&mu_);
  for (const auto& [values, g] : children_) {
    absl::StrAppend(out, name_, LabelText(labels_, values), " ",
                    FormatValue(g->Value()), "\n");
  }
}

template <>
void Family<Histogram>::Write(std::string* out) const {
  WriteHeader(name_, help_, "histogram", out);
  absl::MutexLock lock(&mu_);
  for (const auto& [values, h] : children_) {
    const Histogram::Snapshot s = h->Read();
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      const std::string le =
          i < bounds_.size() ? FormatValue(bounds_[i]) : std::string("+Inf");
      absl::StrAppend(out, name_, "_bucket",
                      LabelText(labels_, values, absl::StrCat("le=\"", le, "\"")),
                      " ", s.cumulative[i], "\n");
    }
    absl::StrAppend(out, name_, "_sum", LabelText(labels_, values), " ",
                    FormatValue(s.sum), "\n", name_, "_count",
                    LabelText(labels_, values), " ", s.count, "\n");
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

void Registry::CheckNew(const std::string& name,
                        const std::vector<std::string>& labels) {
  if (!ValidName(name, /*label=*/false)) Die("bad metric name '" + name + "'");
  for (const std::string& l : labels) {
    if (!ValidName(l, /*label=*/true)) {
      Die(absl::StrCat(name, ": bad label name '", l, "'"));
    }
  }
  for (const std::string& n : names_) {
    // A histogram's series would collide too; names only need to differ.
    if (n == name) Die("metric '" + name + "' registered twice");
  }
  names_.push_back(name);
}

Family<Counter>* Registry::AddCounter(const std::string& name,
                                      const std::string& help,
                                      std::vector<std::string> labels) {
  absl::MutexLock lock(&mu_);
  CheckNew(name, labels);
  counters_.emplace_back(new Family<Counter>(name, help, std::move(labels)));
  order_.emplace_back(kCounter, counters_.size() - 1);
  return counters_.back().get();
}

Family<Gauge>* Registry::AddGauge(const std::string& name,
                                  const std::string& help,
                                  std::vector<std::string> labels) {
  absl::MutexLock lock(&mu_);
  CheckNew(name, labels);
  gauges_.emplace_back(new Family<Gauge>(name, help, std::move(labels)));
  order_.emplace_back(kGauge, gauges_.size() - 1);
  return gauges_.back().get();
}

Family<Histogram>* Registry::AddHistogram(const std::string& name,
                                          const std::string& help,
                                          std::vector<std::string> labels,
                                          std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  CheckNew(name, labels);
  for (const std::string& l : labels) {
    if (l == "le") Die(name + ": a histogram may not have a label 'le'");
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
      Die(name + ": bucket bounds must be finite and increasing");
    }
  }
  histograms_.emplace_back(new Family<Histogram>(
      name, help, std::move(labels), std::move(bounds)));
  order_.emplace_back(kHistogram, histograms_.size() - 1);
  return histograms_.back().get();
}

void Registry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::TextExposition() const {
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  for (const auto& c : collectors) c();
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [kind, i] : order_) {
    switch (kind) {
      case kCounter:
        counters_[i]->Write(&out);
        break;
      case kGauge:
        gauges_[i]->Write(&out);
        break;
      default:
        histograms_[i]->Write(&out);
        break;
    }
  }
  return out;
}

}  // namespace bnps::metrics
