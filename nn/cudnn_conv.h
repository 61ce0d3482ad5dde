// cuDNN convolutions for the CUDA backend (nn/cuda_backend.h): the
// descriptors of one geometry (a plan) and, per direction, the deterministic
// algorithm chosen for it. Private to the backend's target.
//
// Algorithms come from cuDNN's heuristics, not from timing (cudnnFind*), so
// they are a pure function of geometry, GPU and cuDNN version and the results
// round the same on every run; only deterministic ones without tensor cores
// are taken.
//
// Errors: INVALID_ARGUMENT from CheckFitsCudnn; otherwise as cuda_common.h
// (INTERNAL with cuDNN's text, RESOURCE_EXHAUSTED when memory runs out).
//
// Thread-safety: a ConvPlan is thread-compatible; a cuDNN handle must be used
// by one thread at a time.

#ifndef BNPS_NN_CUDNN_CONV_H_
#define BNPS_NN_CUDNN_CONV_H_

#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nn/backend.h"
#include "nn/cuda_common.h"

namespace bnps::nn::cuda_internal {

// An algorithm and the workspace it needs with a plan's descriptors.
template <typename Algo>
struct Chosen {
  Algo algo;
  size_t workspace_bytes;
};

// Descriptors of one geometry and the algorithm chosen per direction (each on
// first use, by the *Algorithm functions below).
struct ConvPlan {
  TensorDesc x;
  TensorDesc y;
  FilterDesc w;
  ConvDesc conv;
  std::optional<Chosen<cudnnConvolutionFwdAlgo_t>> forward;
  std::optional<Chosen<cudnnConvolutionBwdDataAlgo_t>> backward_data;
  std::optional<Chosen<cudnnConvolutionBwdFilterAlgo_t>> backward_filter;
};

// Geometries with the same key share a plan.
using ConvKey = std::array<int64_t, 8>;
ConvKey KeyOf(const ConvGeometry& g);

// INVALID_ARGUMENT unless every size of `g` fits the legacy cuDNN API's int.
absl::Status CheckFitsCudnn(const ConvGeometry& g);

// The descriptors of `g`: NCHW float32, cross-correlation, FMA math (no TF32).
// INTERNAL if cuDNN's output shape differs from g's.
// REQUIRES: CheckFitsCudnn(g) is OK; the device is current.
absl::StatusOr<ConvPlan> MakePlan(const ConvGeometry& g);

// The plan's algorithm for one direction, chosen on first use and kept in
// *plan: the first of cuDNN's heuristic candidates that is deterministic,
// needs no tensor cores and at most 512 MiB of workspace, else the first
// deterministic fallback cuDNN supports; INTERNAL if there is none. `g` is the
// plan's geometry (for error messages). Does not allocate the workspace.
absl::StatusOr<Chosen<cudnnConvolutionFwdAlgo_t>> ForwardAlgorithm(
    cudnnHandle_t handle, ConvPlan* plan, const ConvGeometry& g);
absl::StatusOr<Chosen<cudnnConvolutionBwdDataAlgo_t>> BackwardDataAlgorithm(
    cudnnHandle_t handle, ConvPlan* plan, const ConvGeometry& g);
absl::StatusOr<Chosen<cudnnConvolutionBwdFilterAlgo_t>> BackwardFilterAlgorithm(
    cudnnHandle_t handle, ConvPlan* plan, const ConvGeometry& g);

}  // namespace bnps::nn::cuda_internal

#endif  // BNPS_NN_CUDNN_CONV_H_
