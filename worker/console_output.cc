#include "worker/console_output.h"

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "policy/policy.h"

namespace bnps::worker {

void ProgressPrinter::Finish() {
  if (refresh_ && printed_) std::printf("\n");
  printed_ = false;
}

void ProgressPrinter::operator()(const Progress& p) {
  std::printf(
      "%sstep %lld/%lld epoch %lld loss %.4f acc %.3f img/s %.0f stale %lld "
      "t %.0fs%s",
      refresh_ ? "\r" : "", static_cast<long long>(p.step),
      static_cast<long long>(p.total_steps),
      static_cast<long long>(p.epoch + 1), p.loss, p.accuracy,
      p.images_per_second, static_cast<long long>(p.staleness), p.seconds,
      refresh_ ? "   " : "\n");
  std::fflush(stdout);
  printed_ = true;
}

void PrintResult(const TrainReport& report, const proto::JobConfig& config,
                 RecalMode recal_mode) {
  std::printf(
      "done: %lld steps%s, loss %.4f -> %.4f, %.0f img/s; time %.1fs: compute "
      "%.1fs, BN sync %.1fs, gradient sync %.1fs\n",
      static_cast<long long>(report.steps),
      report.timed_steps == report.steps
          ? ""
          : absl::StrCat(" (", report.timed_steps, " timed)").c_str(),
      report.train_loss_first,
      report.train_loss_last, report.images_per_second, report.seconds_total,
      report.seconds_compute, report.seconds_bn_sync,
      report.seconds_grad_sync);
  const absl::StatusOr<policy::JobPolicy> job =
      policy::FromConfig(config);
  const bool recal_policy = job.ok() && job->bn == policy::Policy::kRecal;
  if (report.test_accuracy.has_value()) {
    std::printf("test accuracy %.4f (running stats%s)\n", *report.test_accuracy,
                recal_policy
                    ? absl::StrCat(", recalibrated ",
                                   RecalModeName(recal_mode))
                          .c_str()
                    : "");
  }
  if (report.test_accuracy_recal.has_value() && !recal_policy) {
    std::printf("test accuracy %.4f after recalibration (%s)\n",
                *report.test_accuracy_recal,
                RecalModeName(recal_mode).c_str());
  }
}

}  // namespace bnps::worker
