// The trainer's small parts that need no training: recalibration mode names
// and the report's JSON (worker/trainer.h).

#include <cmath>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/trainer.h"

namespace bnps::worker {
namespace {

std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.6g", v);
}

std::string Num(const std::optional<double>& v) {
  return v.has_value() ? Num(*v) : "null";
}

}  // namespace

absl::StatusOr<RecalMode> ParseRecalMode(const std::string& name) {
  if (name == "precise") return RecalMode::kPrecise;
  if (name == "exact") return RecalMode::kExact;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown recalibration mode '", name, "' (want precise or exact)"));
}

std::string RecalModeName(RecalMode mode) {
  return mode == RecalMode::kExact ? "exact" : "precise";
}

std::string ReportJson(const TrainReport& r) {
  std::string s = absl::StrCat(
      "{\"worker\": ", r.worker, ", \"num_workers\": ", r.num_workers,
      ", \"policy\": \"", r.policy, "\", \"steps\": ", r.steps,
      ", \"epochs\": ", r.epochs, ", \"examples\": ", r.examples,
      ", \"train_loss_first\": ", Num(r.train_loss_first),
      ", \"train_loss_last\": ", Num(r.train_loss_last),
      ", \"test_accuracy\": ", Num(r.test_accuracy),
      ", \"test_accuracy_recal\": ", Num(r.test_accuracy_recal),
      ", \"images_per_second\": ", Num(r.images_per_second),
      ", \"max_staleness\": ", r.max_staleness, ", \"seconds\": {\"total\": ",
      Num(r.seconds_total), ", \"compute\": ", Num(r.seconds_compute),
      ", \"bn_sync\": ", Num(r.seconds_bn_sync),
      ", \"grad_sync\": ", Num(r.seconds_grad_sync),
      ", \"finish\": ", Num(r.seconds_finish),
      "}, \"timed_steps\": ", r.timed_steps, ", \"history\": [");
  for (size_t i = 0; i < r.history.size(); ++i) {
    const HistoryPoint& h = r.history[i];
    absl::StrAppend(&s, i ? ", " : "", "{\"step\": ", h.step,
                    ", \"seconds\": ", Num(h.seconds), ", \"loss\": ",
                    Num(h.loss), ", \"accuracy\": ", Num(h.accuracy), "}");
  }
  absl::StrAppend(&s, "], \"evals\": [");
  for (size_t i = 0; i < r.evals.size(); ++i) {
    const EvalPoint& e = r.evals[i];
    absl::StrAppend(&s, i ? ", " : "", "{\"epoch\": ", e.epoch,
                    ", \"seconds\": ", Num(e.seconds),
                    ", \"test_accuracy\": ", Num(e.test_accuracy), "}");
  }
  absl::StrAppend(&s, "]}");
  return s;
}

}  // namespace bnps::worker
