#include "nn/layers.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace bnps::nn {
namespace {

absl::Status ShapeError(const std::string& layer, const bn::Shape& in,
                        const std::string& want) {
  return absl::InvalidArgumentError(absl::StrCat(
      "layer ", layer, " cannot take input ", in.ToString(), ": ", want));
}

absl::Status ZeroGrad(Backend& backend, Parameter& p) {
  return backend.Zero(p.grad.data(), p.grad.size());
}

class Conv2d : public Layer {
 public:
  Conv2d(Backend& backend, std::string name, std::unique_ptr<Parameter> w,
         int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t pad)
      : Layer(std::move(name)),
        backend_(backend),
        w_(std::move(w)),
        in_(in),
        out_(out),
        kernel_(kernel),
        stride_(stride),
        pad_(pad) {}

  absl::StatusOr<bn::Shape> OutputShape(const bn::Shape& in) const override {
    const ConvGeometry g = Geometry(in);
    if (in.c != in_ || !ValidateConvGeometry(g).ok()) {
      return ShapeError(name(), in,
                        absl::StrCat(in_, " channels and at least ", kernel_ - 2 * pad_,
                                     " pixels per side"));
    }
    return bn::Shape{in.n, out_, g.out_height(), g.out_width()};
  }

  absl::StatusOr<const Tensor*> Forward(const Tensor& x) override {
    absl::StatusOr<bn::Shape> out = OutputShape(x.shape);
    if (!out.ok()) return out.status();
    if (absl::Status s = Resize(backend_, *out, &y_); !s.ok()) return s;
    if (absl::Status s = backend_.ConvForward(Geometry(x.shape), x.data(),
                                              w_->value.data(), y_.data());
        !s.ok()) {
      return s;
    }
    x_ = &x;
    return &y_;
  }

  absl::StatusOr<const Tensor*> Backward(const Tensor& dy,
                                         bool need_dx) override {
    const ConvGeometry g = Geometry(x_->shape);
    // Independent of dx: computed now or left for later, the same bits.
    auto weights = [this, g, dy = &dy]() -> absl::Status {
      if (g.n == 0) return ZeroGrad(backend_, *w_);
      return backend_.ConvBackwardWeights(g, x_->data(), dy->data(),
                                          w_->grad.data());
    };
    if (later_ != nullptr && need_dx) {
      later_->push_back(weights);
    } else if (absl::Status s = weights(); !s.ok()) {
      return s;
    }
    if (!need_dx) return nullptr;
    if (absl::Status s = Resize(backend_, x_->shape, &dx_); !s.ok()) return s;
    if (absl::Status s = backend_.ConvBackwardData(g, dy.data(),
                                                   w_->value.data(), dx_.data());
        !s.ok()) {
      return s;
    }
    return &dx_;
  }

  void AppendParameters(std::vector<Parameter*>* out) override {
    out->push_back(w_.get());
  }
  void set_deferred(DeferredWork* later) override { later_ = later; }

 private:
  ConvGeometry Geometry(const bn::Shape& in) const {
    return ConvGeometry{in.n, in_, in.h, in.w, out_, kernel_, stride_, pad_};
  }

  Backend& backend_;
  std::unique_ptr<Parameter> w_;
  const int64_t in_, out_, kernel_, stride_, pad_;
  const Tensor* x_ = nullptr;
  Tensor y_, dx_;
  DeferredWork* later_ = nullptr;  // not owned
};

class Relu : public Layer {
 public:
  Relu(Backend& backend, std::string name)
      : Layer(std::move(name)), backend_(backend) {}

  absl::StatusOr<bn::Shape> OutputShape(const bn::Shape& in) const override {
    return in;
  }

  absl::StatusOr<const Tensor*> Forward(const Tensor& x) override {
    if (absl::Status s = Resize(backend_, x.shape, &y_); !s.ok()) return s;
    if (absl::Status s =
            backend_.ReluForward(x.shape.Elements(), x.data(), y_.data());
        !s.ok()) {
      return s;
    }
    return &y_;
  }

  absl::StatusOr<const Tensor*> Backward(const Tensor& dy,
                                         bool need_dx) override {
    if (!need_dx) return nullptr;
    if (absl::Status s = Resize(backend_, y_.shape, &dx_); !s.ok()) return s;
    if (absl::Status s = backend_.ReluBackward(y_.shape.Elements(), dy.data(),
                                               y_.data(), dx_.data());
        !s.ok()) {
      return s;
    }
    return &dx_;
  }

 private:
  Backend& backend_;
  Tensor y_, dx_;
};

class MaxPool : public Layer {
 public:
  MaxPool(Backend& backend, std::string name, int64_t kernel, int64_t stride)
      : Layer(std::move(name)),
        backend_(backend),
        kernel_(kernel),
        stride_(stride) {}

  absl::StatusOr<bn::Shape> OutputShape(const bn::Shape& in) const override {
    const PoolGeometry g = Geometry(in);
    if (!ValidatePoolGeometry(g).ok()) {
      return ShapeError(name(), in,
                        absl::StrCat("at least ", kernel_, " pixels per side"));
    }
    return bn::Shape{in.n, in.c, g.out_height(), g.out_width()};
  }

  absl::StatusOr<const Tensor*> Forward(const Tensor& x) override {
    absl::StatusOr<bn::Shape> out = OutputShape(x.shape);
    if (!out.ok()) return out.status();
    if (absl::Status s = Resize(backend_, *out, &y_); !s.ok()) return s;
    if (absl::Status s =
            backend_.MaxPoolForward(Geometry(x.shape), x.data(), y_.data());
        !s.ok()) {
      return s;
    }
    x_ = &x;
    return &y_;
  }

  absl::StatusOr<const Tensor*> Backward(const Tensor& dy,
                                         bool need_dx) override {
    if (!need_dx) return nullptr;
    if (absl::Status s = Resize(backend_, x_->shape, &dx_); !s.ok()) return s;
    if (absl::Status s = backend_.MaxPoolBackward(
            Geometry(x_->shape), x_->data(), dy.data(), dx_.data());
        !s.ok()) {
      return s;
    }
    return &dx_;
  }

 private:
  PoolGeometry Geometry(const bn::Shape& in) const {
    return PoolGeometry{in.n, in.c, in.h, in.w, kernel_, stride_};
  }

  Backend& backend_;
  const int64_t kernel_, stride_;
  const Tensor* x_ = nullptr;
  Tensor y_, dx_;
};

class GlobalAvgPool : public Layer {
 public:
  GlobalAvgPool(Backend& backend, std::string name)
      : Layer(std::move(name)), backend_(backend) {}

  absl::StatusOr<bn::Shape> OutputShape(const bn::Shape& in) const override {
    if (in.h < 1 || in.w < 1) return ShapeError(name(), in, "an empty image");
    return bn::Shape{in.n, in.c, 1, 1};
  }

  absl::StatusOr<const Tensor*> Forward(const Tensor& x) override {
    absl::StatusOr<bn::Shape> out = OutputShape(x.shape);
    if (!out.ok()) return out.status();
    if (absl::Status s = Resize(backend_, *out, &y_); !s.ok()) return s;
    if (absl::Status s = backend_.GlobalAvgPoolForward(
            x.shape.n, x.shape.c, x.shape.Spatial(), x.data(), y_.data());
        !s.ok()) {
      return s;
    }
    x_ = &x;
    return &y_;
  }

  absl::StatusOr<const Tensor*> Backward(const Tensor& dy,
                                         bool need_dx) override {
    if (!need_dx) return nullptr;
    const bn::Shape& in = x_->shape;
    if (absl::Status s = Resize(backend_, in, &dx_); !s.ok()) return s;
    if (absl::Status s = backend_.GlobalAvgPoolBackward(
            in.n, in.c, in.Spatial(), dy.data(), dx_.data());
        !s.ok()) {
      return s;
    }
    return &dx_;
  }

 private:
  Backend& backend_;
  const Tensor* x_ = nullptr;
  Tensor y_, dx_;
};

class Linear : public Layer {
 public:
  Linear(Backend& backend, std::string name, std::unique_ptr<Parameter> w,
         std::unique_ptr<Parameter> b, int64_t in, int64_t out)
      : Layer(std::move(name)),
        backend_(backend),
        w_(std::move(w)),
        b_(std::move(b)),
        in_(in),
        out_(out) {}

  absl::StatusOr<bn::Shape> OutputShape(const bn::Shape& in) const override {
    if (in.c * in.h * in.w != in_) {
      return ShapeError(name(), in, absl::StrCat(in_, " features"));
    }
    return bn::Shape{in.n, out_, 1, 1};
  }

  absl::StatusOr<const Tensor*> Forward(const Tensor& x) override {
    absl::StatusOr<bn::Shape> out = OutputShape(x.shape);
    if (!out.ok()) return out.status();
    if (absl::Status s = Resize(backend_, *out, &y_); !s.ok()) return s;
    if (absl::Status s =
            backend_.LinearForward({x.shape.n, in_, out_}, x.data(),
                                   w_->value.data(), b_->value.data(), y_.data());
        !s.ok()) {
      return s;
    }
    x_ = &x;
    return &y_;
  }

  absl::StatusOr<const Tensor*> Backward(const Tensor& dy,
                                         bool need_dx) override {
    const int64_t n = x_->shape.n;
    if (n == 0) {
      if (absl::Status s = ZeroGrad(backend_, *w_); !s.ok()) return s;
      if (absl::Status s = ZeroGrad(backend_, *b_); !s.ok()) return s;
    }
    float* dx = nullptr;
    if (need_dx) {
      if (absl::Status s = Resize(backend_, x_->shape, &dx_); !s.ok()) return s;
      dx = dx_.data();
    }
    if (n > 0) {
      if (absl::Status s = backend_.LinearBackward(
              {n, in_, out_}, dy.data(), x_->data(), w_->value.data(), dx,
              w_->grad.data(), b_->grad.data());
          !s.ok()) {
        return s;
      }
    }
    return need_dx ? &dx_ : nullptr;
  }

  void AppendParameters(std::vector<Parameter*>* out) override {
    out->push_back(w_.get());
    out->push_back(b_.get());
  }

 private:
  Backend& backend_;
  std::unique_ptr<Parameter> w_, b_;
  const int64_t in_, out_;
  const Tensor* x_ = nullptr;
  Tensor y_, dx_;
};

class ResidualBlock : public Layer {
 public:
  ResidualBlock(Backend& backend, std::string name,
                std::vector<std::unique_ptr<Layer>> parts)
      : Layer(std::move(name)), backend_(backend), parts_(std::move(parts)) {}

  absl::StatusOr<bn::Shape> OutputShape(const bn::Shape& in) const override {
    bn::Shape s = in;
    for (const auto& part : parts_) {
      absl::StatusOr<bn::Shape> next = part->OutputShape(s);
      if (!next.ok()) return next.status();
      s = *next;
    }
    if (s.c != in.c || s.h != in.h || s.w != in.w) {
      return ShapeError(name(), in, "a shape the block keeps");
    }
    return in;
  }

  absl::StatusOr<const Tensor*> Forward(const Tensor& x) override {
    if (absl::StatusOr<bn::Shape> out = OutputShape(x.shape); !out.ok()) {
      return out.status();
    }
    const Tensor* t = &x;
    for (const auto& part : parts_) {
      absl::StatusOr<const Tensor*> next = part->Forward(*t);
      if (!next.ok()) return next.status();
      t = *next;
    }
    const int64_t n = x.shape.Elements();
    if (absl::Status s = Resize(backend_, x.shape, &y_); !s.ok()) return s;
    if (absl::Status s = backend_.Add(n, t->data(), x.data(), y_.data());
        !s.ok()) {
      return s;
    }
    if (absl::Status s = backend_.ReluForward(n, y_.data(), y_.data());
        !s.ok()) {
      return s;
    }
    return &y_;
  }

  absl::StatusOr<const Tensor*> Backward(const Tensor& dy,
                                         bool need_dx) override {
    const int64_t n = y_.shape.Elements();
    if (absl::Status s = Resize(backend_, y_.shape, &dsum_); !s.ok()) return s;
    if (absl::Status s =
            backend_.ReluBackward(n, dy.data(), y_.data(), dsum_.data());
        !s.ok()) {
      return s;
    }
    const Tensor* d = &dsum_;
    later_.clear();
    for (size_t i = parts_.size(); i-- > 0;) {
      absl::StatusOr<const Tensor*> prev = parts_[i]->Backward(*d, true);
      if (!prev.ok()) {
        later_.clear();
        return prev.status();
      }
      d = *prev;
    }
    // What no batch norm ran (the first convolution's weight gradient).
    for (const auto& work : later_) {
      if (absl::Status s = work(); !s.ok()) {
        later_.clear();
        return s;
      }
    }
    later_.clear();
    if (!need_dx) return nullptr;
    if (absl::Status s = Resize(backend_, y_.shape, &dx_); !s.ok()) return s;
    if (absl::Status s = backend_.Add(n, d->data(), dsum_.data(), dx_.data());
        !s.ok()) {
      return s;
    }
    return &dx_;
  }

  void AppendParameters(std::vector<Parameter*>* out) override {
    for (const auto& part : parts_) part->AppendParameters(out);
  }
  void AppendBatchNorms(std::vector<BatchNorm*>* out) override {
    for (const auto& part : parts_) part->AppendBatchNorms(out);
  }
  void set_backward_overlap(bool on) override {
    for (const auto& part : parts_) part->set_deferred(on ? &later_ : nullptr);
  }

 private:
  Backend& backend_;
  std::vector<std::unique_ptr<Layer>> parts_;
  Tensor y_, dsum_, dx_;
  DeferredWork later_;  // the parts' deferred work, during Backward
};

}  // namespace

absl::Status Resize(Backend& backend, const bn::Shape& shape, Tensor* t) {
  if (absl::Status s = bn::ValidateShape(shape); !s.ok()) return s;
  if (t->buffer.size() < shape.Elements()) {
    absl::StatusOr<Buffer> b = backend.Allocate(shape.Elements());
    if (!b.ok()) return b.status();
    t->buffer = *std::move(b);
  }
  t->shape = shape;
  return absl::OkStatus();
}

int64_t Parameter::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

absl::Status Parameter::SetValue(Backend& backend,
                                 const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != elements()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", name, " has ", elements(), " values, got ",
                     values.size()));
  }
  if (absl::Status s = backend.CopyToDevice(values.data(), elements(),
                                            value.data());
      !s.ok()) {
    return s;
  }
  host = values;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Parameter>> NewParameter(
    Backend& backend, std::string name, std::vector<int64_t> dims) {
  auto p = std::make_unique<Parameter>();
  p->name = std::move(name);
  p->dims = std::move(dims);
  for (int64_t d : p->dims) {
    if (d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p->name, " has a dimension ", d));
    }
  }
  absl::StatusOr<Buffer> value = backend.Allocate(p->elements());
  if (!value.ok()) return value.status();
  absl::StatusOr<Buffer> grad = backend.Allocate(p->elements());
  if (!grad.ok()) return grad.status();
  p->value = *std::move(value);
  p->grad = *std::move(grad);
  p->host.assign(p->elements(), 0.0f);
  return p;
}

absl::StatusOr<std::unique_ptr<Layer>> NewConv2d(Backend& backend,
                                                 std::string name,
                                                 int64_t in_channels,
                                                 int64_t out_channels,
                                                 int64_t kernel, int64_t stride,
                                                 int64_t pad) {
  if (in_channels < 1 || out_channels < 1 || kernel < 1 || stride < 1 ||
      pad < 0 || pad >= kernel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad convolution ", name, ": ", in_channels, " -> ", out_channels,
        " channels, kernel ", kernel, ", stride ", stride, ", pad ", pad));
  }
  absl::StatusOr<std::unique_ptr<Parameter>> w = NewParameter(
      backend, name + ".w", {out_channels, in_channels, kernel, kernel});
  if (!w.ok()) return w.status();
  return std::make_unique<Conv2d>(backend, std::move(name), *std::move(w),
                                  in_channels, out_channels, kernel, stride,
                                  pad);
}

absl::StatusOr<std::unique_ptr<Layer>> NewRelu(Backend& backend,
                                               std::string name) {
  return std::make_unique<Relu>(backend, std::move(name));
}

absl::StatusOr<std::unique_ptr<Layer>> NewMaxPool(Backend& backend,
                                                  std::string name,
                                                  int64_t kernel,
                                                  int64_t stride) {
  if (kernel < 1 || stride < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad pooling ", name, ": kernel ", kernel, ", stride ", stride));
  }
  return std::make_unique<MaxPool>(backend, std::move(name), kernel, stride);
}

absl::StatusOr<std::unique_ptr<Layer>> NewGlobalAvgPool(Backend& backend,
                                                        std::string name) {
  return std::make_unique<GlobalAvgPool>(backend, std::move(name));
}

absl::StatusOr<std::unique_ptr<Layer>> NewLinear(Backend& backend,
                                                 std::string name, int64_t in,
                                                 int64_t out) {
  if (in < 1 || out < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad linear layer ", name, ": ", in, " -> ", out));
  }
  absl::StatusOr<std::unique_ptr<Parameter>> w =
      NewParameter(backend, name + ".w", {out, in});
  if (!w.ok()) return w.status();
  absl::StatusOr<std::unique_ptr<Parameter>> b =
      NewParameter(backend, name + ".b", {out});
  if (!b.ok()) return b.status();
  return std::make_unique<Linear>(backend, std::move(name), *std::move(w),
                                  *std::move(b), in, out);
}

absl::StatusOr<std::unique_ptr<Layer>> NewResidualBlock(Backend& backend,
                                                        std::string name,
                                                        int64_t channels,
                                                        double bn_momentum,
                                                        double bn_eps) {
  std::vector<std::unique_ptr<Layer>> parts;
  for (int i = 1; i <= 2; ++i) {
    absl::StatusOr<std::unique_ptr<Layer>> conv =
        NewConv2d(backend, absl::StrCat(name, ".conv", i), channels, channels,
                  3, 1, 1);
    if (!conv.ok()) return conv.status();
    parts.push_back(*std::move(conv));
    absl::StatusOr<std::unique_ptr<BatchNorm>> bn = BatchNorm::Create(
        backend, absl::StrCat(name, ".bn", i), channels, bn_momentum, bn_eps);
    if (!bn.ok()) return bn.status();
    parts.push_back(*std::move(bn));
    if (i == 1) {
      absl::StatusOr<std::unique_ptr<Layer>> relu =
          NewRelu(backend, absl::StrCat(name, ".relu1"));
      if (!relu.ok()) return relu.status();
      parts.push_back(*std::move(relu));
    }
  }
  return std::make_unique<ResidualBlock>(backend, std::move(name),
                                         std::move(parts));
}

}  // namespace bnps::nn
