#include "worker/device_choice.h"

#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace bnps::worker {
namespace {

// ", CUDA_VISIBLE_DEVICES=2,3" when the variable is set, else "".
std::string Visible(const DeviceRequest& r) {
  if (!r.cuda_visible_devices.has_value()) return "";
  return absl::StrCat("; CUDA_VISIBLE_DEVICES=", *r.cuda_visible_devices);
}

}  // namespace

std::string DeviceChoice::Describe() const {
  if (gpus.empty()) return "cpu";
  std::map<int, int> uses;
  std::vector<std::string> names;
  for (int g : gpus) {
    if (uses[g]++ == 0) names.push_back(absl::StrCat("cuda:", g));
  }
  std::string out = absl::StrJoin(names, ",");
  if (names.size() < gpus.size()) {
    absl::StrAppend(&out, " (", gpus.size(), " replicas share ",
                    names.size() == 1 ? "it" : "them", ")");
  }
  return out;
}

absl::StatusOr<DeviceChoice> ChooseDevices(const DeviceRequest& r,
                                           int device_count,
                                           const std::string& why_none) {
  if (r.device != "auto" && r.device != "cpu" && r.device != "gpu") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=", r.device, " is not one of auto, cpu, gpu"));
  }
  if (r.replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replicas=", r.replicas, " must be at least 1"));
  }
  if (r.gpu < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu=", r.gpu, " is negative"));
  }
  DeviceChoice choice;
  if (r.device == "cpu") {
    choice.reason = "--device=cpu";
    return choice;
  }
  if (device_count <= 0) {
    const std::string why = why_none.empty() ? "no CUDA devices found" : why_none;
    if (r.device == "gpu") {
      return absl::FailedPreconditionError(absl::StrCat(
          "--device=gpu but there is no usable GPU: ", why, Visible(r)));
    }
    choice.reason =
        absl::StrCat("--device=auto chose the CPU: no usable GPU (", why,
                     Visible(r), ")");
    return choice;
  }
  int first = 0;
  std::string why_first;
  if (r.gpu >= 0) {
    if (r.gpu >= device_count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--gpu=", r.gpu, " but ", device_count, " CUDA device",
          device_count == 1 ? " is" : "s are", " visible (cuda:0",
          device_count > 1 ? absl::StrCat("..cuda:", device_count - 1) : "",
          Visible(r), ")"));
    }
    first = r.gpu;
    why_first = absl::StrCat("--gpu=", r.gpu);
  } else if (r.local_rank.has_value()) {
    int rank = -1;
    if (!absl::SimpleAtoi(*r.local_rank, &rank) || rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("LOCAL_RANK=", *r.local_rank,
                       " is not a non-negative integer"));
    }
    first = rank % device_count;
    why_first = absl::StrCat("LOCAL_RANK=", rank, " -> cuda:", first);
    if (rank >= device_count) {
      absl::StrAppend(&why_first, ", shared with other local ranks");
    }
  } else {
    why_first = "the first device";
  }
  for (int i = 0; i < r.replicas; ++i) {
    choice.gpus.push_back((first + i) % device_count);
  }
  const bool shared = r.replicas > device_count;
  choice.reason = absl::StrCat(
      r.device == "auto" ? "--device=auto chose the GPU" : "--device=gpu",
      " (", device_count, " visible", Visible(r), "; ", why_first,
      shared ? absl::StrCat("; ", r.replicas,
                            " replicas on their own streams share ",
                            device_count == 1 ? "it" : "the devices")
             : "",
      ")");
  return choice;
}

}  // namespace bnps::worker
