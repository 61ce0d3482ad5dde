// The layers of a worker's model, on a Backend (backend.h).
//
// A layer owns its parameters, its output and its input gradient. Forward
// reads x and returns its output, which stays valid (and x must stay valid and
// unchanged) until the next Forward; Backward takes d loss / d output and
// returns d loss / d input (or nothing when need_dx is false, as for the first
// layer) and overwrites the gradients of the layer's parameters with those of
// this batch. Gradients are of the SUM of the per-example losses: the servers
// divide by the number of examples of the step.
//
// Batch norm goes through a BnExchange (bn_exchange.h) while training, so every policy
// applies to every BN layer without the layers knowing which one is in force.
//
// Parameter names: "<layer>.w" (convolution and linear weights), "<layer>.b"
// (linear bias), "<layer>.gamma" and "<layer>.beta" (batch norm). A BN layer's
// own name is the key of its statistics on the servers.
//
// Errors: INVALID_ARGUMENT when an input's shape does not fit the layer, plus
// whatever the backend or the BnExchange returns.
//
// Thread-safety: thread-compatible; a model runs on one thread.

#ifndef BNPS_NN_LAYERS_H_
#define BNPS_NN_LAYERS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bn/kernels.h"
#include "bn/moments.h"
#include "bn/shape.h"
#include "nn/backend.h"
#include "nn/bn_exchange.h"

namespace bnps::nn {

// An activation in backend memory: NCHW, a matrix being {n, features, 1, 1}.
struct Tensor {
  bn::Shape shape;
  Buffer buffer;  // holds at least shape.Elements() floats

  float* data() { return buffer.data(); }
  const float* data() const { return buffer.data(); }
};

// Sets t->shape, growing t's buffer when it is too small (its contents are
// then lost).
absl::Status Resize(Backend& backend, const bn::Shape& shape, Tensor* t);

// A trainable tensor. `host` mirrors `value` (set together by SetValue), so
// layers that need parameters on the host (batch norm's gamma) need no copy.
struct Parameter {
  std::string name;
  std::vector<int64_t> dims;
  Buffer value;
  Buffer grad;  // d(sum of losses) / d value after the last Backward
  std::vector<float> host;

  int64_t elements() const;
  absl::Status SetValue(Backend& backend, const std::vector<float>& values);
};

// Creates a parameter with zeroed value and gradient.
absl::StatusOr<std::unique_ptr<Parameter>> NewParameter(
    Backend& backend, std::string name, std::vector<int64_t> dims);

class BatchNorm;

// Work a layer's Backward leaves for later: a convolution's weight gradient,
// which a batch norm before it (in model order) computes while its backward
// exchange is in flight. Each item returns its error.
using DeferredWork = std::vector<std::function<absl::Status()>>;

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }

  // The output shape for input shape `in`; INVALID_ARGUMENT if it does not
  // fit the layer.
  virtual absl::StatusOr<bn::Shape> OutputShape(const bn::Shape& in) const = 0;
  virtual absl::StatusOr<const Tensor*> Forward(const Tensor& x) = 0;
  virtual absl::StatusOr<const Tensor*> Backward(const Tensor& dy,
                                                 bool need_dx) = 0;

  // With `on`, Backward overlaps each BN backward exchange inside the layer
  // with the weight gradient of the convolution after the BN; the gradients
  // are the same bit for bit, and final when Backward returns. Default: off.
  // Layers without such a pair ignore it.
  virtual void set_backward_overlap(bool on) {}
  // Where Backward leaves deferrable work (a convolution) or runs what is
  // there during its exchange (a batch norm); not owned, null: none. Set by
  // the layer that holds both, which runs what is left at its end.
  virtual void set_deferred(DeferredWork* later) {}

  // Appends this layer's parameters / BN layers (its own and its parts').
  virtual void AppendParameters(std::vector<Parameter*>* out) {}
  virtual void AppendBatchNorms(std::vector<BatchNorm*>* out) {}

 private:
  const std::string name_;
};

// 3x3 (or k x k) convolution without bias; weights [out, in, k, k].
absl::StatusOr<std::unique_ptr<Layer>> NewConv2d(Backend& backend,
                                                 std::string name,
                                                 int64_t in_channels,
                                                 int64_t out_channels,
                                                 int64_t kernel, int64_t stride,
                                                 int64_t pad);
absl::StatusOr<std::unique_ptr<Layer>> NewRelu(Backend& backend,
                                               std::string name);
absl::StatusOr<std::unique_ptr<Layer>> NewMaxPool(Backend& backend,
                                                  std::string name,
                                                  int64_t kernel,
                                                  int64_t stride);
// [n, c, h, w] -> [n, c, 1, 1].
absl::StatusOr<std::unique_ptr<Layer>> NewGlobalAvgPool(Backend& backend,
                                                        std::string name);
// [n, c, h, w] (flattened to [n, c*h*w]) -> [n, out, 1, 1].
absl::StatusOr<std::unique_ptr<Layer>> NewLinear(Backend& backend,
                                                 std::string name, int64_t in,
                                                 int64_t out);
// relu(bn2(conv2(relu(bn1(conv1(x))))) + x), 3x3 convolutions keeping the
// shape [n, channels, h, w]. Parts are named <name>.conv1, <name>.bn1, ...
absl::StatusOr<std::unique_ptr<Layer>> NewResidualBlock(Backend& backend,
                                                        std::string name,
                                                        int64_t channels,
                                                        double bn_momentum,
                                                        double bn_eps);

enum class BnMode {
  // Normalize with what the BnExchange returns and update the running statistics
  // from it. The only mode that supports Backward.
  kTrain,
  // Normalize with the running statistics (unbiased variance, as PyTorch).
  kInference,
  // Normalize with the local batch's moments and keep them in collected();
  // running statistics unchanged. For recalibration passes.
  kCollect,
};

// Batch norm over the channels of [n, c, h, w]; parameters gamma (init 1) and
// beta (init 0).
class BatchNorm : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<BatchNorm>> Create(
      Backend& backend, std::string name, int64_t channels, double momentum,
      double eps);

  absl::StatusOr<bn::Shape> OutputShape(const bn::Shape& in) const override;
  absl::StatusOr<const Tensor*> Forward(const Tensor& x) override;
  absl::StatusOr<const Tensor*> Backward(const Tensor& dy,
                                         bool need_dx) override;
  void AppendParameters(std::vector<Parameter*>* out) override;
  void AppendBatchNorms(std::vector<BatchNorm*>* out) override {
    out->push_back(this);
  }
  void set_deferred(DeferredWork* later) override { later_ = later; }

  int64_t channels() const { return channels_; }
  BnMode mode() const { return mode_; }
  void set_mode(BnMode mode) { mode_ = mode; }
  // Not owned; must be set (and outlive the calls) before a kTrain Forward.
  void set_sync(BnExchange* sync) { sync_ = sync; }

  const bn::RunningStats& running() const { return running_; }
  // INVALID_ARGUMENT unless mean and var have channels() finite values and
  // var >= 0.
  absl::Status set_running(bn::RunningStats running);
  // The moments of the last kCollect Forward.
  const bn::Moments& collected() const { return collected_; }

 private:
  BatchNorm(Backend& backend, std::string name, int64_t channels,
            double momentum, double eps);
  bn::Normalization Norm() const;

  Backend& backend_;
  const int64_t channels_;
  const double momentum_;
  const double eps_;
  std::unique_ptr<Parameter> gamma_;
  std::unique_ptr<Parameter> beta_;
  BnMode mode_ = BnMode::kTrain;
  BnExchange* sync_ = nullptr;
  DeferredWork* later_ = nullptr;  // not owned
  bn::RunningStats running_;
  bn::Moments collected_;

  // Set by Forward for Backward.
  const Tensor* x_ = nullptr;
  bool trained_ = false;  // the last Forward was kTrain
  std::vector<double> mean_;
  std::vector<double> var_;
  int64_t count_ = 0;
  Tensor y_;
  Tensor dx_;
  std::vector<float> grad_host_;
};

}  // namespace bnps::nn

#endif  // BNPS_NN_LAYERS_H_
