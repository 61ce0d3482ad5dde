// The compute a worker's layers need, behind one interface with a CPU
// implementation (oneDNN plus bn/ CPU kernels: cpu_backend.h) and a GPU one
// (cuDNN, cuBLAS and the bn/ CUDA kernels: cuda_backend.h). The CPU backend is
// the reference the GPU backend is tested against.
//
// Memory. Tensors live in the backend's memory (host memory for the CPU
// backend, device memory for the GPU backend) as Buffers the backend allocates;
// every tensor pointer passed to an operation points into such memory, holds
// float32 values, and activations are NCHW (a matrix is N x F, row-major).
// CopyToDevice and CopyToHost move values between host memory and backend
// memory; they are complete when they return.
//
// Operations overwrite their outputs (nothing accumulates unless the name says
// so), are complete when they return (the GPU backend synchronizes its stream),
// and accept a batch of n == 0 as a no-op that leaves the outputs alone --
// workers with an empty batch still take part in a step. Weight gradients of
// an empty batch are the caller's to zero.
//
// Errors: INVALID_ARGUMENT for a geometry that does not make sense (the
// Validate functions below), a negative element count or a null pointer for a
// non-empty tensor; RESOURCE_EXHAUSTED when memory runs out; INTERNAL with the
// library's error text when oneDNN, CUDA, cuDNN or cuBLAS fails. The Backend
// base class checks the arguments, once per call and before any backend code
// runs, so every backend rejects the same calls with the same message (a
// backend may add limits of its own, e.g. cuDNN's int dimensions).
//
// Implementing a backend: override the private Do* methods (one per public
// operation, same parameters). The base calls them only with arguments that
// passed the checks above and never for an empty batch or count (n == 0), so
// a Do* may assume valid geometry, n > 0 and non-null tensors (except the
// optional dx of DoLinearBackward).
//
// Thread-safety: a backend is thread-compatible: one per worker thread.

#ifndef BNPS_NN_BACKEND_H_
#define BNPS_NN_BACKEND_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bn/kernels.h"

namespace bnps::nn {

// A 2-D convolution without bias (a BN layer follows every convolution):
// x [n, in_channels, height, width], w [out_channels, in_channels, kernel,
// kernel], y [n, out_channels, out_height(), out_width()], square kernel,
// the same stride and zero padding on both axes.
struct ConvGeometry {
  int64_t n = 0;
  int64_t in_channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t out_channels = 0;
  int64_t kernel = 3;
  int64_t stride = 1;
  int64_t pad = 1;

  int64_t out_height() const { return (height + 2 * pad - kernel) / stride + 1; }
  int64_t out_width() const { return (width + 2 * pad - kernel) / stride + 1; }
  int64_t input_elements() const { return n * in_channels * height * width; }
  int64_t output_elements() const {
    return n * out_channels * out_height() * out_width();
  }
  int64_t weight_elements() const {
    return out_channels * in_channels * kernel * kernel;
  }
};

// INVALID_ARGUMENT unless n >= 0, the other sizes >= 1, pad >= 0, pad < kernel
// and the kernel fits the padded input.
absl::Status ValidateConvGeometry(const ConvGeometry& g);

// Max pooling without padding: x [n, channels, height, width] ->
// y [n, channels, out_height(), out_width()], windows kernel x kernel at
// stride `stride`. Ties go to the first maximum in row-major window order, so
// every backend routes the gradient to the same element.
struct PoolGeometry {
  int64_t n = 0;
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t kernel = 2;
  int64_t stride = 2;

  int64_t out_height() const { return (height - kernel) / stride + 1; }
  int64_t out_width() const { return (width - kernel) / stride + 1; }
  int64_t input_elements() const { return n * channels * height * width; }
  int64_t output_elements() const {
    return n * channels * out_height() * out_width();
  }
};

// INVALID_ARGUMENT unless n >= 0, the other sizes >= 1 and the kernel fits.
absl::Status ValidatePoolGeometry(const PoolGeometry& g);

// A fully connected layer: x [n, in] -> y [n, out] = x w^T + b, w [out, in],
// b [out]. Valid if n >= 0 and in, out >= 1.
struct LinearGeometry {
  int64_t n = 0;
  int64_t in = 0;
  int64_t out = 0;
};

class Backend;

// `size()` floats of a backend's memory, freed through that backend.
// Move-only; the backend must outlive its buffers.
class Buffer {
 public:
  Buffer() = default;
  // Takes ownership of `data` (from backend->Allocate).
  Buffer(Backend* backend, float* data, int64_t size)
      : backend_(backend), data_(data), size_(size) {}
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  void Release();

  Backend* backend_ = nullptr;  // not owned
  float* data_ = nullptr;
  int64_t size_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda:<ordinal>".
  virtual std::string name() const = 0;

  // n floats of zeroed backend memory (n >= 0; n == 0 gives an empty buffer,
  // without calling the backend). RESOURCE_EXHAUSTED if n floats are more
  // bytes than int64_t holds.
  absl::StatusOr<Buffer> Allocate(int64_t n);
  absl::Status CopyToDevice(const float* host, int64_t n, float* dst);
  absl::Status CopyToHost(const float* src, int64_t n, float* host);
  // Several CopyToHost at once (a model's gradients): the same checks per
  // copy, one wait at the end where the backend can queue them (the GPU
  // copies through pinned memory on its stream). On error the destinations
  // may hold some of the values.
  struct HostCopy {
    const float* src;
    int64_t n;
    float* host;
  };
  absl::Status CopyManyToHost(absl::Span<const HostCopy> copies);
  absl::Status Zero(float* dst, int64_t n);

  // The BN kernels working on this backend's memory; owned by the backend.
  virtual bn::BnKernels& bn() = 0;

  // y = conv(x, w).
  absl::Status ConvForward(const ConvGeometry& g, const float* x,
                           const float* w, float* y);
  // dx = d loss / d x, from dy = d loss / d y.
  absl::Status ConvBackwardData(const ConvGeometry& g, const float* dy,
                                const float* w, float* dx);
  // dw = d loss / d w, summed over the batch.
  absl::Status ConvBackwardWeights(const ConvGeometry& g, const float* x,
                                   const float* dy, float* dw);

  // y = x w^T + b.
  absl::Status LinearForward(const LinearGeometry& g, const float* x,
                             const float* w, const float* b, float* y);
  // dx = dy w (skipped when dx is null), dw = dy^T x, db = column sums of dy.
  absl::Status LinearBackward(const LinearGeometry& g, const float* dy,
                              const float* x, const float* w, float* dx,
                              float* dw, float* db);

  // y = max(x, 0), elementwise over n values; y may alias x.
  absl::Status ReluForward(int64_t n, const float* x, float* y);
  // dx = dy where y > 0, else 0; dx may alias dy.
  absl::Status ReluBackward(int64_t n, const float* dy, const float* y,
                            float* dx);

  absl::Status MaxPoolForward(const PoolGeometry& g, const float* x, float* y);
  // dx (overwritten, zero outside the maxima) from x and dy.
  absl::Status MaxPoolBackward(const PoolGeometry& g, const float* x,
                               const float* dy, float* dx);

  // y[i, c] = mean over the plane of x[i, c]; x [n, c, hw], y [n, c]. Needs
  // n >= 0, c >= 1 and hw >= 1.
  absl::Status GlobalAvgPoolForward(int64_t n, int64_t c, int64_t hw,
                                    const float* x, float* y);
  // dx[i, c, :] = dy[i, c] / hw.
  absl::Status GlobalAvgPoolBackward(int64_t n, int64_t c, int64_t hw,
                                     const float* dy, float* dx);

  // y = a + b over n values; y may alias a or b.
  absl::Status Add(int64_t n, const float* a, const float* b, float* y);

 protected:
  friend class Buffer;
  // Frees memory from Allocate. Never fails (errors are logged).
  virtual void Free(float* data) = 0;

 private:
  // The operations above, called only with checked arguments and n > 0 (see
  // "Implementing a backend" at the top of this file).
  virtual absl::StatusOr<Buffer> DoAllocate(int64_t n) = 0;
  virtual absl::Status DoCopyToDevice(const float* host, int64_t n,
                                      float* dst) = 0;
  virtual absl::Status DoCopyToHost(const float* src, int64_t n,
                                    float* host) = 0;
  // Copies with n > 0 only. Default: DoCopyToHost one after another.
  virtual absl::Status DoCopyManyToHost(absl::Span<const HostCopy> copies);
  virtual absl::Status DoZero(float* dst, int64_t n) = 0;
  virtual absl::Status DoConvForward(const ConvGeometry& g, const float* x,
                                     const float* w, float* y) = 0;
  virtual absl::Status DoConvBackwardData(const ConvGeometry& g,
                                          const float* dy, const float* w,
                                          float* dx) = 0;
  virtual absl::Status DoConvBackwardWeights(const ConvGeometry& g,
                                             const float* x, const float* dy,
                                             float* dw) = 0;
  virtual absl::Status DoLinearForward(const LinearGeometry& g, const float* x,
                                       const float* w, const float* b,
                                       float* y) = 0;
  virtual absl::Status DoLinearBackward(const LinearGeometry& g,
                                        const float* dy, const float* x,
                                        const float* w, float* dx, float* dw,
                                        float* db) = 0;
  virtual absl::Status DoReluForward(int64_t n, const float* x, float* y) = 0;
  virtual absl::Status DoReluBackward(int64_t n, const float* dy,
                                      const float* y, float* dx) = 0;
  virtual absl::Status DoMaxPoolForward(const PoolGeometry& g, const float* x,
                                        float* y) = 0;
  virtual absl::Status DoMaxPoolBackward(const PoolGeometry& g, const float* x,
                                         const float* dy, float* dx) = 0;
  virtual absl::Status DoGlobalAvgPoolForward(int64_t n, int64_t c, int64_t hw,
                                              const float* x, float* y) = 0;
  virtual absl::Status DoGlobalAvgPoolBackward(int64_t n, int64_t c, int64_t hw,
                                               const float* dy, float* dx) = 0;
  virtual absl::Status DoAdd(int64_t n, const float* a, const float* b,
                             float* y) = 0;
};

}  // namespace bnps::nn

#endif  // BNPS_NN_BACKEND_H_
