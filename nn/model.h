// The worker's model: a list of layers (layers.h) built from options, with
// softmax cross-entropy on top.
//
// Three architectures (ModelOptions::architecture, the worker's --model).
// The default, kCnn ("cnn"), is a small ResNet-style CNN for 28x28 grayscale
// images:
//
//   stem     conv3x3(1 -> width) - BN - ReLU - maxpool 2x2       28x28 -> 14x14
//   stage 1  `depth` residual blocks of width channels            14x14
//   down     conv3x3 stride 2 (width -> 2 width) - BN - ReLU      14x14 -> 7x7
//   stage 2  `depth` residual blocks of 2 width channels          7x7
//   head     global average pool - linear(2 width -> classes)
//
// kDeep ("deep") continues the CNN to small feature maps, so its deepest BN
// layers see 4 positions per example (28x28 input):
//
//   ... stage 2 as above                                          7x7
//   down2    conv3x3 stride 2 (2 width -> 4 width) - BN - ReLU    7x7 -> 4x4
//   stage 3  `depth` residual blocks of 4 width channels          4x4
//   down3    conv3x3 stride 2 (4 width -> 4 width) - BN - ReLU    4x4 -> 2x2
//   stage 4  `depth` residual blocks of 4 width channels          2x2
//   head     global average pool - linear(4 width -> classes)
//
// kFcBn ("fc_bn") has BN after fully connected layers only, whose statistics
// are over the batch alone (one position per example):
//
//   depth + 1 times: linear(-> 8 width) - BN - ReLU   (the first flattens
//                                                      the image)
//   head     linear(8 width -> classes)
//
// A BN layer's statistics are over batch x height x width of its input; the
// fewest positions per example of any BN layer is bn_positions_per_example()
// (cnn 49, deep 4, fc_bn 1 on 28x28), so a worker's fewest samples per
// channel are its batch times that. With one example per worker, local BN
// in fc_bn sees one sample: variance 0, every output is beta and no gradient
// flows to the layers below (what bn/kernels.h computes for a count of 1).
//
// A step is Forward (training mode: BN through the BnExchange), Loss, Backward;
// Gradients then holds d(sum of the batch's losses) / d parameter. Parameters
// come from outside (the servers): SetParameters before Forward, or layer by
// layer during it (Forward's ParametersNeeded).
//
// Errors: INVALID_ARGUMENT for bad options, images of the wrong size, missing
// or misshapen parameters, bad labels; the layers' and backend's errors
// otherwise.
//
// Thread-safety: thread-compatible; one thread drives a model.

#ifndef BNPS_NN_MODEL_H_
#define BNPS_NN_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "nn/backend.h"
#include "nn/bn_exchange.h"
#include "nn/layers.h"
#include "nn/loss.h"

namespace bnps::nn {

enum class Architecture { kCnn, kDeep, kFcBn };

// "cnn", "deep", "fc_bn"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<Architecture> ParseArchitecture(const std::string& name);
std::string ArchitectureName(Architecture a);

struct ModelOptions {
  // Which model (see above). Default: kCnn.
  Architecture architecture = Architecture::kCnn;
  // Residual blocks per stage (fc_bn: hidden layers - 1), >= 0. Default: 1.
  int64_t depth = 1;
  // Channels of the stem and stage 1 (stage 2 has twice as many, stages 3
  // and 4 four times; fc_bn's hidden layers have 8 width units), >= 1.
  // Default: 16.
  int64_t width = 16;
  // Input images: channels x height x width, each >= 1; height and width
  // must leave at least 1 pixel after the stem's pooling and the stride-2
  // convolution (>= 4). Default: 1 x 28 x 28.
  int64_t in_channels = 1;
  int64_t image_height = 28;
  int64_t image_width = 28;
  // Output classes, >= 1. Default: 10.
  int64_t classes = 10;
  // BN running-stats momentum in [0, 1] (used when the layers keep their own
  // running stats) and epsilon > 0. Defaults: 0.1, 1e-5 (as PyTorch).
  double bn_momentum = 0.1;
  double bn_eps = 1e-5;
};

absl::Status ValidateModelOptions(const ModelOptions& options);

// A tensor on the host: a parameter's value or gradient.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};
using HostTensors = std::map<std::string, HostTensor>;

class Model {
 public:
  // `backend` is not owned and must outlive the model.
  static absl::StatusOr<std::unique_ptr<Model>> Create(
      const ModelOptions& options, Backend* backend);

  const ModelOptions& options() const { return options_; }
  Backend& backend() { return *backend_; }
  // In model order; owned by the layers.
  const std::vector<Parameter*>& parameters() const { return parameters_; }
  const std::vector<BatchNorm*>& batch_norms() const { return batch_norms_; }
  int64_t num_weights() const;
  // The fewest height x width positions per example over the BN layers'
  // inputs (the worker's samples per channel are batch x this); 0 without
  // BN layers.
  int64_t bn_positions_per_example() const { return bn_positions_; }

  // Initial values from `seed` (the same for every seed on every platform):
  // convolution weights He-normal, linear weights and bias uniform in
  // +-1/sqrt(fan_in) (as PyTorch), gamma 1, beta 0.
  HostTensors InitialParameters(uint64_t seed) const;
  // Sets every parameter. INVALID_ARGUMENT naming the first one missing or of
  // the wrong shape; entries the model does not have are ignored.
  absl::Status SetParameters(const HostTensors& values);
  // The gradients of the last Backward, downloaded.
  absl::StatusOr<HostTensors> Gradients() const;
  // Those of `params` only (the model's own, e.g. from a GradientsFinal).
  absl::StatusOr<HostTensors> Gradients(
      absl::Span<const Parameter* const> params) const;

  // Overlap each BN backward exchange with the weight gradient of the
  // convolution after the BN, where the model has such a pair (the residual
  // blocks' first BN); the results are the same bit for bit. Default: off.
  void SetBackwardOverlap(bool on);

  void SetBnMode(BnMode mode);
  // Not owned; must outlive the training-mode Forward/Backward calls.
  void SetBnExchange(BnExchange* sync);

  // Sets one of the model's own parameters (SetParameters' checks), e.g.
  // from a ParametersNeeded.
  absl::Status SetParameter(Parameter* p, absl::Span<const int64_t> shape,
                            const std::vector<float>& values);

  // Runs the layers on n images (host memory, NCHW, n * in_channels *
  // image_height * image_width floats; n >= 0). The logits are then in
  // logits() ([n, classes], host).
  absl::Status Forward(const float* images, int64_t n);
  // Called during Forward just before a layer with parameters runs, with
  // its parameters, so a caller can set their values (SetParameter) as they
  // arrive: the first layers compute while the later ones' are still on
  // their way. Every parameter comes exactly once, layers in model order;
  // an error ends the pass with that status.
  using ParametersNeeded =
      std::function<absl::Status(absl::Span<Parameter* const>)>;
  // As Forward, calling `before` (may be empty) as above.
  absl::Status Forward(const float* images, int64_t n,
                       const ParametersNeeded& before);
  const std::vector<float>& logits() const { return logits_; }
  // Softmax cross-entropy of the last Forward's logits against `labels` (n
  // of them); keeps d loss_sum / d logits for Backward.
  absl::StatusOr<LossResult> Loss(const int32_t* labels);
  // Back-propagates the last Loss through the layers (training mode only).
  absl::Status Backward();
  // Called during Backward with parameters whose gradients are final (a
  // layer's, once the pass is through it), so a caller can send them while
  // the pass goes on. Every parameter comes exactly once, layers in reverse
  // model order; an error ends the pass with that status.
  using GradientsFinal =
      std::function<absl::Status(absl::Span<const Parameter* const>)>;
  // As Backward, calling `on_final` (may be empty) as above. The gradients
  // are those Backward() computes, bit for bit.
  absl::Status Backward(const GradientsFinal& on_final);

 private:
  Model(const ModelOptions& options, Backend* backend)
      : options_(options), backend_(backend) {}
  absl::Status Add(absl::StatusOr<std::unique_ptr<Layer>> layer);

  const ModelOptions options_;
  Backend* const backend_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Parameter*> parameters_;
  // layers_[i]'s parameters are parameters_[layer_params_[i],
  // layer_params_[i + 1]).
  std::vector<size_t> layer_params_ = {0};
  std::vector<BatchNorm*> batch_norms_;
  int64_t bn_positions_ = 0;

  int64_t n_ = 0;  // examples of the last Forward
  Tensor input_;
  std::vector<float> logits_;
  std::vector<float> dlogits_host_;
  Tensor dlogits_;
};

}  // namespace bnps::nn

#endif  // BNPS_NN_MODEL_H_
