#include "metrics/registry.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bnps::metrics {
namespace {

using ::testing::HasSubstr;

TEST(FormatValueTest, ShortestRoundTripAndSpecials) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(2.5e-05), "2.5e-05");
  EXPECT_EQ(FormatValue(123456789012.0), "123456789012");
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatValue(0.0 / 0.0), "NaN");
}

TEST(EscapeTest, LabelValuesAndHelp) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(EscapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");
}

TEST(RegistryTest, CounterWithLabels) {
  Registry r;
  Family<Counter>* f = r.AddCounter("x_total", "Things.", {"kind", "code"});
  Counter* a = f->WithLabels({"a", "ok"});
  EXPECT_EQ(a, f->WithLabels({"a", "ok"}));  // resolved once, kept
  a->Increment();
  a->Increment(4);
  f->WithLabels({"b\"", "x"})->Increment(2);
  EXPECT_EQ(a->Value(), 5);
  EXPECT_EQ(r.TextExposition(),
            "# HELP x_total Things.\n"
            "# TYPE x_total counter\n"
            "x_total{kind=\"a\",code=\"ok\"} 5\n"
            "x_total{kind=\"b\\\"\",code=\"x\"} 2\n");
}

TEST(RegistryTest, GaugeWithoutLabelsAndCollector) {
  Registry r;
  Gauge* g = r.AddGauge("g", "A gauge\nover two lines.")->WithLabels({});
  int calls = 0;
  r.AddCollector([&] {
    ++calls;
    g->Set(1.5);
  });
  g->Add(-3);
  EXPECT_EQ(g->Value(), -3);
  EXPECT_EQ(r.TextExposition(),
            "# HELP g A gauge\\nover two lines.\n"
            "# TYPE g gauge\n"
            "g 1.5\n");
  EXPECT_EQ(calls, 1);
}

TEST(RegistryTest, FamilyWithoutChildrenWritesOnlyItsHeader) {
  Registry r;
  r.AddGauge("later_seconds", "Set later.");
  EXPECT_EQ(r.TextExposition(),
            "# HELP later_seconds Set later.\n# TYPE later_seconds gauge\n");
}

TEST(RegistryTest, HistogramBucketsAreCumulative) {
  Registry r;
  Histogram* h = r.AddHistogram("wait_seconds", "Waits.", {"layer"},
                                {0.1, 1, 10})
                     ->WithLabels({"bn1"});
  for (double v : {0.05, 0.1, 0.5, 2.0, 20.0, 30.0}) h->Observe(v);
  const Histogram::Snapshot s = h->Read();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 3, 4, 6}));
  EXPECT_EQ(s.count, 6u);
  EXPECT_DOUBLE_EQ(s.sum, 52.65);
  EXPECT_EQ(r.TextExposition(),
            "# HELP wait_seconds Waits.\n"
            "# TYPE wait_seconds histogram\n"
            "wait_seconds_bucket{layer=\"bn1\",le=\"0.1\"} 2\n"
            "wait_seconds_bucket{layer=\"bn1\",le=\"1\"} 3\n"
            "wait_seconds_bucket{layer=\"bn1\",le=\"10\"} 4\n"
            "wait_seconds_bucket{layer=\"bn1\",le=\"+Inf\"} 6\n"
            "wait_seconds_sum{layer=\"bn1\"} 52.65\n"
            "wait_seconds_count{layer=\"bn1\"} 6\n");
}

TEST(RegistryTest, HistogramWithoutLabels) {
  Registry r;
  r.AddHistogram("h", "H.", {}, {1})->WithLabels({})->Observe(3);
  EXPECT_THAT(r.TextExposition(), HasSubstr("h_bucket{le=\"+Inf\"} 1\nh_sum 3\n"
                                            "h_count 1\n"));
}

TEST(RegistryTest, FamiliesInRegistrationOrder) {
  Registry r;
  r.AddGauge("b", "B.");
  r.AddCounter("a_total", "A.");
  const std::string text = r.TextExposition();
  EXPECT_LT(text.find("# TYPE b gauge"), text.find("# TYPE a_total counter"));
}

TEST(RegistryTest, ConcurrentObservationsAreAllCounted) {
  Registry r;
  Counter* c = r.AddCounter("c_total", "C.")->WithLabels({});
  Histogram* h = r.AddHistogram("h", "H.", {}, {0.5})->WithLabels({});
  Gauge* g = r.AddGauge("g", "G.")->WithLabels({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c->Increment();
        h->Observe(1);
        g->Add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->Value(), 40000);
  EXPECT_EQ(h->Read().count, 40000u);
  EXPECT_EQ(h->Read().sum, 40000);
  EXPECT_EQ(g->Value(), 40000);
}

TEST(BucketsTest, ExponentialAndLinear) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(LinearBuckets(0, 5, 3), (std::vector<double>{0, 5, 10}));
}

TEST(RegistryDeathTest, ProgrammingErrorsAbort) {
  Registry r;
  r.AddCounter("dup_total", "D.", {"l"});
  EXPECT_DEATH(r.AddGauge("dup_total", "again"), "registered twice");
  EXPECT_DEATH(r.AddGauge("1bad", "B."), "bad metric name");
  EXPECT_DEATH(r.AddGauge("ok", "B.", {"__reserved"}), "bad label name");
  EXPECT_DEATH(r.AddHistogram("h", "H.", {"le"}, {1}), "label 'le'");
  EXPECT_DEATH(r.AddHistogram("h2", "H.", {}, {2, 1}), "increasing");
  Family<Counter>* f = r.AddCounter("f_total", "F.", {"a", "b"});
  EXPECT_DEATH(f->WithLabels({"only one"}), "1 label values for 2 labels");
}

}  // namespace
}  // namespace bnps::metrics
