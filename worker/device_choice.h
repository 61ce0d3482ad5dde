// Which device each of a worker's model replicas trains on, and why.
//
// The rules (docs/gpu.md), in the conventions of PyTorch launchers:
//   --device=cpu           the CPU.
//   --device=gpu | auto    a GPU; auto takes the CPU when no GPU is usable,
//                          gpu is then an error.
//   the first replica's GPU: --gpu=K when given; else LOCAL_RANK modulo the
//                          visible devices (torchrun, the launcher); else 0.
//   replica i              the first replica's GPU + i, modulo the visible
//                          devices: with fewer GPUs than replicas, replicas
//                          share a device (each on its own stream).
// Device numbers are CUDA's, i.e. after CUDA_VISIBLE_DEVICES remapped them;
// the reason names the variable when it is set.
//
// Pure logic: the caller reads the flags and the environment and asks CUDA
// for the device count. Thread-compatible.

#ifndef BNPS_WORKER_DEVICE_CHOICE_H_
#define BNPS_WORKER_DEVICE_CHOICE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace bnps::worker {

struct DeviceRequest {
  std::string device = "auto";  // --device: auto | cpu | gpu
  int gpu = -1;                 // --gpu; -1: not given
  int replicas = 1;             // --replicas, >= 1
  // The environment's LOCAL_RANK and CUDA_VISIBLE_DEVICES, when set.
  std::optional<std::string> local_rank;
  std::optional<std::string> cuda_visible_devices;
};

struct DeviceChoice {
  // Empty: every replica on the CPU. Else one CUDA device per replica.
  std::vector<int> gpus;
  // One sentence for the worker's first line, e.g.
  // "--device=auto chose the GPU (1 visible; LOCAL_RANK=3 -> cuda:0)".
  std::string reason;

  bool cpu() const { return gpus.empty(); }
  // "cpu", "cuda:0", "cuda:0,cuda:1", "cuda:0 (2 replicas share it)".
  std::string Describe() const;
};

// `device_count` is the number of usable CUDA devices (0 when none), and
// `why_none` CUDA's reason when it is 0. Errors: INVALID_ARGUMENT for a bad
// --device, --gpu, --replicas or LOCAL_RANK; FAILED_PRECONDITION for
// --device=gpu without a usable GPU and for --gpu beyond the visible devices.
absl::StatusOr<DeviceChoice> ChooseDevices(const DeviceRequest& request,
                                           int device_count,
                                           const std::string& why_none);

}  // namespace bnps::worker

#endif  // BNPS_WORKER_DEVICE_CHOICE_H_
