// What bnps_worker prints on its standard output while and after it trains:
// a progress line every --progress_interval_s (one refreshed line on a
// terminal, a line each otherwise) and the run's last lines.
//
// Thread-safety: a ProgressPrinter is called from the trainer's thread only.

#ifndef BNPS_WORKER_CONSOLE_OUTPUT_H_
#define BNPS_WORKER_CONSOLE_OUTPUT_H_

#include "proto/bnps.pb.h"
#include "worker/trainer.h"

namespace bnps::worker {

class ProgressPrinter {
 public:
  // `refresh`: rewrite one line ("\r"), for a terminal.
  explicit ProgressPrinter(bool refresh) : refresh_(refresh) {}

  // Ends a refreshed line.
  void Finish();
  void operator()(const Progress& p);

 private:
  const bool refresh_;
  bool printed_ = false;
};

// The run's last lines: steps, loss, speed and where the time went; the
// test accuracy (and after recalibration).
void PrintResult(const TrainReport& report, const proto::JobConfig& config,
                 RecalMode recal_mode);

}  // namespace bnps::worker

#endif  // BNPS_WORKER_CONSOLE_OUTPUT_H_
