// Small helpers shared by the trainer's files (trainer.cc,
// trainer_finish.cc). Private to //worker:trainer.

#ifndef BNPS_WORKER_TRAINER_INTERNAL_H_
#define BNPS_WORKER_TRAINER_INTERNAL_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "nn/model.h"

namespace bnps::worker::trainer_internal {

inline double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

inline absl::Status Annotate(const absl::Status& s, const std::string& where) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

inline nn::HostTensors ToHost(client::Params params) {
  nn::HostTensors out;
  for (auto& [name, p] : params) {
    out.emplace(name, nn::HostTensor{std::move(p.shape), std::move(p.values)});
  }
  return out;
}

inline client::Params ToParams(nn::HostTensors tensors) {
  client::Params out;
  for (auto& [name, t] : tensors) {
    out.emplace(name, client::Param{std::move(t.shape), std::move(t.values)});
  }
  return out;
}

}  // namespace bnps::worker::trainer_internal

#endif  // BNPS_WORKER_TRAINER_INTERNAL_H_
