// The argument checks of the Backend base class (backend.h), through a fake
// backend that records which Do* methods run: a bad call is refused with the
// shared message and never reaches the backend, an empty batch is OK without
// reaching it, and a good call reaches it exactly once with its arguments.

#include "nn/backend.h"

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace bnps::nn {
namespace {

// One call of a Do* method: its name, integer arguments (geometry fields or
// counts, in declaration order) and pointer arguments (in parameter order).
struct Call {
  std::string op;
  std::vector<int64_t> sizes;
  std::vector<const void*> tensors;

  bool operator==(const Call& o) const {
    return op == o.op && sizes == o.sizes && tensors == o.tensors;
  }
};

std::ostream& operator<<(std::ostream& os, const Call& c) {
  os << c.op << "(";
  for (int64_t v : c.sizes) os << v << " ";
  for (const void* p : c.tensors) os << p << " ";
  return os << ")";
}

std::vector<int64_t> Sizes(const ConvGeometry& g) {
  return {g.n,      g.in_channels, g.height, g.width, g.out_channels,
          g.kernel, g.stride,      g.pad};
}
std::vector<int64_t> Sizes(const PoolGeometry& g) {
  return {g.n, g.channels, g.height, g.width, g.kernel, g.stride};
}
std::vector<int64_t> Sizes(const LinearGeometry& g) {
  return {g.n, g.in, g.out};
}

// Records every Do* call and returns `result` from it.
class FakeBackend : public Backend {
 public:
  std::string name() const override { return "fake"; }
  bn::BnKernels& bn() override { std::abort(); }

  std::vector<Call> calls;
  std::vector<float*> freed;
  absl::Status result = absl::OkStatus();

 protected:
  void Free(float* data) override {
    freed.push_back(data);
    delete[] data;
  }

 private:
  absl::Status Record(Call call) {
    calls.push_back(std::move(call));
    return result;
  }

  absl::StatusOr<Buffer> DoAllocate(int64_t n) override {
    calls.push_back({"Allocate", {n}, {}});
    if (!result.ok()) return result;
    return Buffer(this, new float[n](), n);
  }
  absl::Status DoCopyToDevice(const float* host, int64_t n,
                              float* dst) override {
    return Record({"CopyToDevice", {n}, {host, dst}});
  }
  absl::Status DoCopyToHost(const float* src, int64_t n, float* host) override {
    return Record({"CopyToHost", {n}, {src, host}});
  }
  absl::Status DoZero(float* dst, int64_t n) override {
    return Record({"Zero", {n}, {dst}});
  }
  absl::Status DoConvForward(const ConvGeometry& g, const float* x,
                             const float* w, float* y) override {
    return Record({"ConvForward", Sizes(g), {x, w, y}});
  }
  absl::Status DoConvBackwardData(const ConvGeometry& g, const float* dy,
                                  const float* w, float* dx) override {
    return Record({"ConvBackwardData", Sizes(g), {dy, w, dx}});
  }
  absl::Status DoConvBackwardWeights(const ConvGeometry& g, const float* x,
                                     const float* dy, float* dw) override {
    return Record({"ConvBackwardWeights", Sizes(g), {x, dy, dw}});
  }
  absl::Status DoLinearForward(const LinearGeometry& g, const float* x,
                               const float* w, const float* b,
                               float* y) override {
    return Record({"LinearForward", Sizes(g), {x, w, b, y}});
  }
  absl::Status DoLinearBackward(const LinearGeometry& g, const float* dy,
                                const float* x, const float* w, float* dx,
                                float* dw, float* db) override {
    return Record({"LinearBackward", Sizes(g), {dy, x, w, dx, dw, db}});
  }
  absl::Status DoReluForward(int64_t n, const float* x, float* y) override {
    return Record({"ReluForward", {n}, {x, y}});
  }
  absl::Status DoReluBackward(int64_t n, const float* dy, const float* y,
                              float* dx) override {
    return Record({"ReluBackward", {n}, {dy, y, dx}});
  }
  absl::Status DoMaxPoolForward(const PoolGeometry& g, const float* x,
                                float* y) override {
    return Record({"MaxPoolForward", Sizes(g), {x, y}});
  }
  absl::Status DoMaxPoolBackward(const PoolGeometry& g, const float* x,
                                 const float* dy, float* dx) override {
    return Record({"MaxPoolBackward", Sizes(g), {x, dy, dx}});
  }
  absl::Status DoGlobalAvgPoolForward(int64_t n, int64_t c, int64_t hw,
                                      const float* x, float* y) override {
    return Record({"GlobalAvgPoolForward", {n, c, hw}, {x, y}});
  }
  absl::Status DoGlobalAvgPoolBackward(int64_t n, int64_t c, int64_t hw,
                                       const float* dy, float* dx) override {
    return Record({"GlobalAvgPoolBackward", {n, c, hw}, {dy, dx}});
  }
  absl::Status DoAdd(int64_t n, const float* a, const float* b,
                     float* y) override {
    return Record({"Add", {n}, {a, b, y}});
  }
};

// Expects INVALID_ARGUMENT with exactly `message`, and no Do* call.
void ExpectRefused(const FakeBackend& backend, const absl::Status& s,
                   const std::string& message) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), message);
  EXPECT_TRUE(backend.calls.empty())
      << "reached " << backend.calls.front() << " for: " << message;
}

// Expects OK and no Do* call.
void ExpectNoOp(const FakeBackend& backend, const absl::Status& s) {
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(backend.calls.empty()) << "reached " << backend.calls.front();
}

// Expects OK and exactly the one Do* call `want`.
void ExpectReached(const FakeBackend& backend, const absl::Status& s,
                   const Call& want) {
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(backend.calls, std::vector<Call>{want});
}

class BackendTest : public ::testing::Test {
 protected:
  // Distinct non-null tensors; the fake never dereferences them.
  float* T(int i) { return storage_.data() + i; }

  FakeBackend backend_;

 private:
  std::vector<float> storage_ = std::vector<float>(16);
};

// ---- Convolutions
// -------------------------------------------------------------

// The three convolution operations, with their tensors in parameter order and
// the element count of each for a geometry.
struct ConvOp {
  const char* name;
  std::function<absl::Status(Backend&, const ConvGeometry&, const float*,
                             const float*, float*)>
      call;
  const char* tensor_names[3];
  std::function<int64_t(const ConvGeometry&)> elements[3];
  int weights;  // the position of the weights (or their gradient)
};

int64_t ConvIn(const ConvGeometry& g) { return g.input_elements(); }
int64_t ConvWeights(const ConvGeometry& g) { return g.weight_elements(); }
int64_t ConvOut(const ConvGeometry& g) { return g.output_elements(); }

std::vector<ConvOp> ConvOps() {
  return {
      {"ConvForward",
       [](Backend& b, const ConvGeometry& g, const float* p0, const float* p1,
          float* p2) { return b.ConvForward(g, p0, p1, p2); },
       {"x", "w", "y"},
       {ConvIn, ConvWeights, ConvOut},
       1},
      {"ConvBackwardData",
       [](Backend& b, const ConvGeometry& g, const float* p0, const float* p1,
          float* p2) { return b.ConvBackwardData(g, p0, p1, p2); },
       {"dy", "w", "dx"},
       {ConvOut, ConvWeights, ConvIn},
       1},
      {"ConvBackwardWeights",
       [](Backend& b, const ConvGeometry& g, const float* p0, const float* p1,
          float* p2) { return b.ConvBackwardWeights(g, p0, p1, p2); },
       {"x", "dy", "dw"},
       {ConvIn, ConvOut, ConvWeights},
       2},
  };
}

TEST_F(BackendTest, ConvolutionBadGeometryNeverReachesTheBackend) {
  const std::pair<ConvGeometry, const char*> cases[] = {
      {{-1, 1, 4, 4, 1, 3, 1, 1},
       "bad convolution geometry: n=-1 in_channels=1 height=4 width=4 "
       "out_channels=1 kernel=3 stride=1 pad=1"},
      {{1, 0, 4, 4, 1, 3, 1, 1},
       "bad convolution geometry: n=1 in_channels=0 height=4 width=4 "
       "out_channels=1 kernel=3 stride=1 pad=1"},
      {{1, 1, 0, 4, 1, 3, 1, 1},
       "bad convolution geometry: n=1 in_channels=1 height=0 width=4 "
       "out_channels=1 kernel=3 stride=1 pad=1"},
      {{1, 1, 4, 0, 1, 3, 1, 1},
       "bad convolution geometry: n=1 in_channels=1 height=4 width=0 "
       "out_channels=1 kernel=3 stride=1 pad=1"},
      {{1, 1, 4, 4, 0, 3, 1, 1},
       "bad convolution geometry: n=1 in_channels=1 height=4 width=4 "
       "out_channels=0 kernel=3 stride=1 pad=1"},
      {{1, 1, 4, 4, 1, 0, 1, 0},
       "bad convolution geometry: n=1 in_channels=1 height=4 width=4 "
       "out_channels=1 kernel=0 stride=1 pad=0"},
      {{1, 1, 4, 4, 1, 3, 0, 1},
       "bad convolution geometry: n=1 in_channels=1 height=4 width=4 "
       "out_channels=1 kernel=3 stride=0 pad=1"},
      {{1, 1, 4, 4, 1, 3, 1, -1},
       "bad convolution geometry: n=1 in_channels=1 height=4 width=4 "
       "out_channels=1 kernel=3 stride=1 pad=-1"},
      {{1, 1, 4, 4, 1, 3, 1, 3},  // pad >= kernel
       "bad convolution geometry: n=1 in_channels=1 height=4 width=4 "
       "out_channels=1 kernel=3 stride=1 pad=3"},
      {{1, 1, 2, 8, 1, 5, 1, 1},  // kernel beyond the padded height
       "bad convolution geometry: n=1 in_channels=1 height=2 width=8 "
       "out_channels=1 kernel=5 stride=1 pad=1"},
      {{1, 1, 8, 2, 1, 5, 1, 1},  // kernel beyond the padded width
       "bad convolution geometry: n=1 in_channels=1 height=8 width=2 "
       "out_channels=1 kernel=5 stride=1 pad=1"},
      // An empty batch does not excuse a bad geometry.
      {{0, 1, 4, 4, 1, 3, 1, 3},
       "bad convolution geometry: n=0 in_channels=1 height=4 width=4 "
       "out_channels=1 kernel=3 stride=1 pad=3"},
  };
  for (const ConvOp& op : ConvOps()) {
    for (const auto& [g, message] : cases) {
      SCOPED_TRACE(testing::Message() << op.name << ": " << message);
      backend_.calls.clear();
      ExpectRefused(backend_, op.call(backend_, g, T(0), T(1), T(2)), message);
    }
  }
}

TEST_F(BackendTest, ConvolutionNullTensorNeverReachesTheBackend) {
  const ConvGeometry g{2, 3, 5, 4, 6, 3, 2, 1};  // output 3 x 2
  ASSERT_EQ(g.input_elements(), 120);
  ASSERT_EQ(g.weight_elements(), 162);
  ASSERT_EQ(g.output_elements(), 72);
  for (const ConvOp& op : ConvOps()) {
    for (int i = 0; i < 3; ++i) {
      SCOPED_TRACE(testing::Message() << op.name << ": null " << i);
      backend_.calls.clear();
      float* p[3] = {T(0), T(1), T(2)};
      p[i] = nullptr;
      ExpectRefused(backend_, op.call(backend_, g, p[0], p[1], p[2]),
                    std::string(op.tensor_names[i]) +
                        " is null for a tensor of " +
                        std::to_string(op.elements[i](g)) + " values");
    }
    // Every tensor null: the first in parameter order is named.
    backend_.calls.clear();
    ExpectRefused(backend_, op.call(backend_, g, nullptr, nullptr, nullptr),
                  std::string(op.tensor_names[0]) +
                      " is null for a tensor of " +
                      std::to_string(op.elements[0](g)) + " values");
  }
}

TEST_F(BackendTest, ConvolutionEmptyBatch) {
  const ConvGeometry g{0, 2, 4, 4, 3, 3, 1, 1};
  for (const ConvOp& op : ConvOps()) {
    SCOPED_TRACE(op.name);
    // Activations are empty and may be null; weights never are.
    float* p[3] = {nullptr, nullptr, nullptr};
    p[op.weights] = T(op.weights);
    backend_.calls.clear();
    ExpectNoOp(backend_, op.call(backend_, g, p[0], p[1], p[2]));
    ExpectNoOp(backend_, op.call(backend_, g, T(0), T(1), T(2)));
    ExpectRefused(backend_, op.call(backend_, g, nullptr, nullptr, nullptr),
                  std::string(op.tensor_names[op.weights]) +
                      " is null for a tensor of 54 values");
  }
}

TEST_F(BackendTest, ConvolutionReachesTheBackendOnce) {
  const ConvGeometry g{2, 3, 5, 4, 6, 3, 2, 1};
  for (const ConvOp& op : ConvOps()) {
    SCOPED_TRACE(op.name);
    backend_.calls.clear();
    ExpectReached(backend_, op.call(backend_, g, T(0), T(1), T(2)),
                  {op.name, Sizes(g), {T(0), T(1), T(2)}});
  }
}

// ---- Linear
// -------------------------------------------------------------------

TEST_F(BackendTest, LinearForward) {
  const LinearGeometry g{2, 3, 4};
  ExpectReached(backend_, backend_.LinearForward(g, T(0), T(1), T(2), T(3)),
                {"LinearForward", {2, 3, 4}, {T(0), T(1), T(2), T(3)}});

  const std::pair<LinearGeometry, const char*> bad[] = {
      {{-1, 3, 4}, "bad linear geometry: n=-1 in=3 out=4"},
      {{2, 0, 4}, "bad linear geometry: n=2 in=0 out=4"},
      {{2, 3, 0}, "bad linear geometry: n=2 in=3 out=0"},
      {{0, 0, 4}, "bad linear geometry: n=0 in=0 out=4"},
  };
  for (const auto& [geometry, message] : bad) {
    backend_.calls.clear();
    ExpectRefused(backend_,
                  backend_.LinearForward(geometry, T(0), T(1), T(2), T(3)),
                  message);
  }
  const char* names[] = {"x", "w", "b", "y"};
  const int64_t elements[] = {6, 12, 4, 8};
  for (int i = 0; i < 4; ++i) {
    backend_.calls.clear();
    float* p[4] = {T(0), T(1), T(2), T(3)};
    p[i] = nullptr;
    ExpectRefused(backend_, backend_.LinearForward(g, p[0], p[1], p[2], p[3]),
                  std::string(names[i]) + " is null for a tensor of " +
                      std::to_string(elements[i]) + " values");
  }

  const LinearGeometry empty{0, 3, 4};
  backend_.calls.clear();
  ExpectNoOp(backend_,
             backend_.LinearForward(empty, nullptr, T(1), T(2), nullptr));
  ExpectRefused(backend_,
                backend_.LinearForward(empty, nullptr, T(1), nullptr, nullptr),
                "b is null for a tensor of 4 values");
}

TEST_F(BackendTest, LinearBackward) {
  const LinearGeometry g{2, 3, 4};
  ExpectReached(
      backend_, backend_.LinearBackward(g, T(0), T(1), T(2), T(3), T(4), T(5)),
      {"LinearBackward", {2, 3, 4}, {T(0), T(1), T(2), T(3), T(4), T(5)}});
  // dx is optional: a null dx reaches the backend as null.
  backend_.calls.clear();
  ExpectReached(
      backend_,
      backend_.LinearBackward(g, T(0), T(1), T(2), nullptr, T(4), T(5)),
      {"LinearBackward", {2, 3, 4}, {T(0), T(1), T(2), nullptr, T(4), T(5)}});

  backend_.calls.clear();
  ExpectRefused(backend_,
                backend_.LinearBackward(LinearGeometry{2, 3, 0}, T(0), T(1),
                                        T(2), T(3), T(4), T(5)),
                "bad linear geometry: n=2 in=3 out=0");
  // dx is not checked; every other tensor is (w also when dx is null).
  const char* names[] = {"dy", "x", "w", "dw", "db"};
  const int64_t elements[] = {8, 6, 12, 12, 4};
  const int positions[] = {0, 1, 2, 4, 5};
  for (int i = 0; i < 5; ++i) {
    for (bool with_dx : {true, false}) {
      SCOPED_TRACE(testing::Message() << names[i] << " dx=" << with_dx);
      backend_.calls.clear();
      float* p[6] = {T(0), T(1), T(2), T(3), T(4), T(5)};
      if (!with_dx) p[3] = nullptr;
      p[positions[i]] = nullptr;
      ExpectRefused(
          backend_,
          backend_.LinearBackward(g, p[0], p[1], p[2], p[3], p[4], p[5]),
          std::string(names[i]) + " is null for a tensor of " +
              std::to_string(elements[i]) + " values");
    }
  }

  const LinearGeometry empty{0, 3, 4};
  backend_.calls.clear();
  ExpectNoOp(backend_, backend_.LinearBackward(empty, nullptr, nullptr, T(2),
                                               nullptr, T(4), T(5)));
  ExpectRefused(backend_,
                backend_.LinearBackward(empty, nullptr, nullptr, T(2), nullptr,
                                        nullptr, T(5)),
                "dw is null for a tensor of 12 values");
}

// ---- Pooling
// ------------------------------------------------------------------

TEST_F(BackendTest, MaxPool) {
  const PoolGeometry g{2, 3, 5, 4, 2, 2};  // output 2 x 2: 24 values
  ASSERT_EQ(g.input_elements(), 120);
  ASSERT_EQ(g.output_elements(), 24);
  ExpectReached(backend_, backend_.MaxPoolForward(g, T(0), T(1)),
                {"MaxPoolForward", Sizes(g), {T(0), T(1)}});
  backend_.calls.clear();
  ExpectReached(backend_, backend_.MaxPoolBackward(g, T(0), T(1), T(2)),
                {"MaxPoolBackward", Sizes(g), {T(0), T(1), T(2)}});

  const std::pair<PoolGeometry, const char*> bad[] = {
      {{-1, 1, 4, 4, 2, 2},
       "bad pooling geometry: n=-1 channels=1 height=4 width=4 kernel=2 "
       "stride=2"},
      {{1, 0, 4, 4, 2, 2},
       "bad pooling geometry: n=1 channels=0 height=4 width=4 kernel=2 "
       "stride=2"},
      {{1, 1, 0, 4, 2, 2},
       "bad pooling geometry: n=1 channels=1 height=0 width=4 kernel=2 "
       "stride=2"},
      {{1, 1, 4, 0, 2, 2},
       "bad pooling geometry: n=1 channels=1 height=4 width=0 kernel=2 "
       "stride=2"},
      {{1, 1, 4, 4, 0, 2},
       "bad pooling geometry: n=1 channels=1 height=4 width=4 kernel=0 "
       "stride=2"},
      {{1, 1, 4, 4, 2, 0},
       "bad pooling geometry: n=1 channels=1 height=4 width=4 kernel=2 "
       "stride=0"},
      {{1, 1, 2, 4, 3, 1},
       "bad pooling geometry: n=1 channels=1 height=2 width=4 kernel=3 "
       "stride=1"},
      {{0, 1, 4, 2, 3, 1},
       "bad pooling geometry: n=0 channels=1 height=4 width=2 kernel=3 "
       "stride=1"},
  };
  for (const auto& [geometry, message] : bad) {
    SCOPED_TRACE(message);
    backend_.calls.clear();
    ExpectRefused(backend_, backend_.MaxPoolForward(geometry, T(0), T(1)),
                  message);
    ExpectRefused(backend_,
                  backend_.MaxPoolBackward(geometry, T(0), T(1), T(2)),
                  message);
  }

  backend_.calls.clear();
  ExpectRefused(backend_, backend_.MaxPoolForward(g, nullptr, T(1)),
                "x is null for a tensor of 120 values");
  ExpectRefused(backend_, backend_.MaxPoolForward(g, T(0), nullptr),
                "y is null for a tensor of 24 values");
  ExpectRefused(backend_, backend_.MaxPoolBackward(g, nullptr, T(1), T(2)),
                "x is null for a tensor of 120 values");
  ExpectRefused(backend_, backend_.MaxPoolBackward(g, T(0), nullptr, T(2)),
                "dy is null for a tensor of 24 values");
  ExpectRefused(backend_, backend_.MaxPoolBackward(g, T(0), T(1), nullptr),
                "dx is null for a tensor of 120 values");

  const PoolGeometry empty{0, 3, 4, 4, 2, 2};
  ExpectNoOp(backend_, backend_.MaxPoolForward(empty, nullptr, nullptr));
  ExpectNoOp(backend_,
             backend_.MaxPoolBackward(empty, nullptr, nullptr, nullptr));
}

TEST_F(BackendTest, GlobalAvgPool) {
  ExpectReached(backend_, backend_.GlobalAvgPoolForward(2, 3, 5, T(0), T(1)),
                {"GlobalAvgPoolForward", {2, 3, 5}, {T(0), T(1)}});
  backend_.calls.clear();
  ExpectReached(backend_, backend_.GlobalAvgPoolBackward(2, 3, 5, T(0), T(1)),
                {"GlobalAvgPoolBackward", {2, 3, 5}, {T(0), T(1)}});

  const std::pair<std::vector<int64_t>, const char*> bad[] = {
      {{-1, 3, 5}, "bad global average pooling geometry: n=-1 c=3 hw=5"},
      {{2, 0, 5}, "bad global average pooling geometry: n=2 c=0 hw=5"},
      {{2, 3, 0}, "bad global average pooling geometry: n=2 c=3 hw=0"},
      {{0, 3, 0}, "bad global average pooling geometry: n=0 c=3 hw=0"},
  };
  for (const auto& [d, message] : bad) {
    SCOPED_TRACE(message);
    backend_.calls.clear();
    ExpectRefused(backend_,
                  backend_.GlobalAvgPoolForward(d[0], d[1], d[2], T(0), T(1)),
                  message);
    ExpectRefused(backend_,
                  backend_.GlobalAvgPoolBackward(d[0], d[1], d[2], T(0), T(1)),
                  message);
  }

  backend_.calls.clear();
  ExpectRefused(backend_, backend_.GlobalAvgPoolForward(2, 3, 5, nullptr, T(1)),
                "x is null for a tensor of 30 values");
  ExpectRefused(backend_, backend_.GlobalAvgPoolForward(2, 3, 5, T(0), nullptr),
                "y is null for a tensor of 6 values");
  ExpectRefused(backend_,
                backend_.GlobalAvgPoolBackward(2, 3, 5, nullptr, T(1)),
                "dy is null for a tensor of 6 values");
  ExpectRefused(backend_,
                backend_.GlobalAvgPoolBackward(2, 3, 5, T(0), nullptr),
                "dx is null for a tensor of 30 values");

  ExpectNoOp(backend_,
             backend_.GlobalAvgPoolForward(0, 3, 5, nullptr, nullptr));
  ExpectNoOp(backend_,
             backend_.GlobalAvgPoolBackward(0, 3, 5, nullptr, nullptr));
}

// ---- Elementwise
// --------------------------------------------------------------

// An operation over n values with k tensors.
struct ElementwiseOp {
  const char* name;
  std::vector<const char*> tensor_names;
  std::function<absl::Status(Backend&, int64_t, std::vector<float*>)> call;
};

std::vector<ElementwiseOp> ElementwiseOps() {
  return {
      {"ReluForward",
       {"x", "y"},
       [](Backend& b, int64_t n, std::vector<float*> p) {
         return b.ReluForward(n, p[0], p[1]);
       }},
      {"ReluBackward",
       {"dy", "y", "dx"},
       [](Backend& b, int64_t n, std::vector<float*> p) {
         return b.ReluBackward(n, p[0], p[1], p[2]);
       }},
      {"Add",
       {"a", "b", "y"},
       [](Backend& b, int64_t n, std::vector<float*> p) {
         return b.Add(n, p[0], p[1], p[2]);
       }},
      {"Zero",
       {"dst"},
       [](Backend& b, int64_t n, std::vector<float*> p) {
         return b.Zero(p[0], n);
       }},
      {"CopyToDevice",
       {"source", "destination"},
       [](Backend& b, int64_t n, std::vector<float*> p) {
         return b.CopyToDevice(p[0], n, p[1]);
       }},
      {"CopyToHost",
       {"source", "destination"},
       [](Backend& b, int64_t n, std::vector<float*> p) {
         return b.CopyToHost(p[0], n, p[1]);
       }},
  };
}

TEST_F(BackendTest, ElementwiseOperations) {
  for (const ElementwiseOp& op : ElementwiseOps()) {
    SCOPED_TRACE(op.name);
    const size_t k = op.tensor_names.size();
    std::vector<float*> p;
    std::vector<const void*> want;
    for (size_t i = 0; i < k; ++i) {
      p.push_back(T(static_cast<int>(i)));
      want.push_back(p.back());
    }

    backend_.calls.clear();
    ExpectReached(backend_, op.call(backend_, 7, p), {op.name, {7}, want});

    backend_.calls.clear();
    ExpectRefused(backend_, op.call(backend_, -1, p),
                  std::string(op.name) + ": negative element count -1");
    // The count is checked before the tensors.
    ExpectRefused(backend_,
                  op.call(backend_, -3, std::vector<float*>(k, nullptr)),
                  std::string(op.name) + ": negative element count -3");

    for (size_t i = 0; i < k; ++i) {
      std::vector<float*> q = p;
      q[i] = nullptr;
      ExpectRefused(backend_, op.call(backend_, 7, q),
                    std::string(op.tensor_names[i]) +
                        " is null for a tensor of 7 values");
    }

    ExpectNoOp(backend_, op.call(backend_, 0, std::vector<float*>(k, nullptr)));
    ExpectNoOp(backend_, op.call(backend_, 0, p));
  }
}

// ---- Allocate
// -----------------------------------------------------------------

TEST_F(BackendTest, Allocate) {
  {
    absl::StatusOr<Buffer> b = backend_.Allocate(5);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->size(), 5);
    ASSERT_NE(b->data(), nullptr);
    EXPECT_EQ(backend_.calls, (std::vector<Call>{{"Allocate", {5}, {}}}));
    EXPECT_TRUE(backend_.freed.empty());
    float* data = b->data();
    b = absl::StatusOr<Buffer>(Buffer());
    EXPECT_EQ(backend_.freed, std::vector<float*>{data});
  }

  backend_.calls.clear();
  absl::StatusOr<Buffer> negative = backend_.Allocate(-1);
  ExpectRefused(backend_, negative.status(),
                "Allocate: negative element count -1");

  {
    absl::StatusOr<Buffer> empty = backend_.Allocate(0);
    ASSERT_TRUE(empty.ok()) << empty.status();
    EXPECT_EQ(empty->size(), 0);
    EXPECT_EQ(empty->data(), nullptr);
    EXPECT_TRUE(backend_.calls.empty());
  }
  EXPECT_EQ(backend_.freed.size(), 1u) << "an empty buffer frees nothing";

  constexpr int64_t kTooMany = std::numeric_limits<int64_t>::max() /
                                   static_cast<int64_t>(sizeof(float)) +
                               1;
  absl::StatusOr<Buffer> huge = backend_.Allocate(kTooMany);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(huge.status().message(),
            "Allocate of 2305843009213693952 floats: too many bytes");
  EXPECT_TRUE(backend_.calls.empty());

  // The largest count whose bytes fit reaches the backend (which fails it).
  backend_.result = absl::ResourceExhaustedError("fake: out of memory");
  absl::StatusOr<Buffer> largest = backend_.Allocate(kTooMany - 1);
  EXPECT_EQ(largest.status(), backend_.result);
  EXPECT_EQ(backend_.calls,
            (std::vector<Call>{{"Allocate", {kTooMany - 1}, {}}}));
}

// ---- Results
// ------------------------------------------------------------------

TEST_F(BackendTest, CopyManyToHostChecksEveryCopyBeforeAny) {
  // The null source of the second copy stops all of them.
  ExpectRefused(backend_,
                backend_.CopyManyToHost({{T(0), 2, T(1)}, {nullptr, 2, T(3)}}),
                "source is null for a tensor of 2 values");
  // Empty copies are skipped; the others go in order (the default: one
  // DoCopyToHost each).
  EXPECT_TRUE(backend_.CopyManyToHost({{T(0), 2, T(1)}, {nullptr, 0, nullptr},
                                       {T(4), 3, T(8)}})
                  .ok());
  EXPECT_EQ(backend_.calls,
            (std::vector<Call>{{"CopyToHost", {2}, {T(0), T(1)}},
                               {"CopyToHost", {3}, {T(4), T(8)}}}));
  backend_.calls.clear();
  ExpectNoOp(backend_, backend_.CopyManyToHost({}));
}

TEST_F(BackendTest, TheBackendsStatusIsReturned) {
  backend_.result = absl::InternalError("fake: the library failed");
  EXPECT_EQ(backend_.ConvForward(ConvGeometry{1, 1, 4, 4, 1, 3, 1, 1}, T(0),
                                 T(1), T(2)),
            backend_.result);
  EXPECT_EQ(backend_.LinearBackward(LinearGeometry{1, 2, 3}, T(0), T(1), T(2),
                                    nullptr, T(4), T(5)),
            backend_.result);
  EXPECT_EQ(backend_.MaxPoolForward(PoolGeometry{1, 1, 4, 4, 2, 2}, T(0), T(1)),
            backend_.result);
  EXPECT_EQ(backend_.GlobalAvgPoolBackward(1, 1, 4, T(0), T(1)),
            backend_.result);
  EXPECT_EQ(backend_.Add(3, T(0), T(1), T(2)), backend_.result);
  EXPECT_EQ(backend_.CopyToHost(T(0), 3, T(1)), backend_.result);
  EXPECT_EQ(backend_.calls.size(), 6u);
}

}  // namespace
}  // namespace bnps::nn
