#include "worker/data/idx.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <zlib.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace bnps::worker {
namespace {

using Bytes = std::vector<uint8_t>;

void Put32(uint32_t v, Bytes* out) {
  out->push_back(static_cast<uint8_t>(v >> 24));
  out->push_back(static_cast<uint8_t>(v >> 16));
  out->push_back(static_cast<uint8_t>(v >> 8));
  out->push_back(static_cast<uint8_t>(v));
}

Bytes ImagesFile(uint32_t count, uint32_t rows, uint32_t cols,
                 const Bytes& pixels, uint32_t magic = 0x00000803) {
  Bytes b;
  Put32(magic, &b);
  Put32(count, &b);
  Put32(rows, &b);
  Put32(cols, &b);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

Bytes LabelsFile(uint32_t count, const Bytes& labels,
                 uint32_t magic = 0x00000801) {
  Bytes b;
  Put32(magic, &b);
  Put32(count, &b);
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

void WriteFile(const std::string& path, const Bytes& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    if (!bytes.empty()) {
      ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
                static_cast<int>(bytes.size()));
    }
    ASSERT_EQ(gzclose(f), Z_OK);
  } else {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    if (!bytes.empty()) {
      ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    }
    ASSERT_EQ(std::fclose(f), 0);
  }
}

Bytes ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

class IdxFixture : public testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = testing::TempDir() + "/idx_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    images_ = dir_ + "/images";
    labels_ = dir_ + "/labels";
  }

  bool gzip() const { return gzip_; }

  // A valid 5-image 3x4 dataset.
  static constexpr uint32_t kCount = 5, kRows = 3, kCols = 4;
  Bytes Pixels() const {
    Bytes p(kCount * kRows * kCols);
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i * 7);
    return p;
  }
  Bytes Labels() const { return {3, 0, 9, 1, 9}; }

  void WriteValid() {
    WriteFile(images_, ImagesFile(kCount, kRows, kCols, Pixels()), gzip());
    WriteFile(labels_, LabelsFile(kCount, Labels()), gzip());
  }

  // Expects `code` and a message that names `path`.
  void ExpectError(absl::StatusCode code, const std::string& path,
                   const std::string& also = "") {
    absl::StatusOr<Dataset> d = LoadIdx(images_, labels_);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), code) << d.status();
    EXPECT_TRUE(absl::StrContains(d.status().message(), path)) << d.status();
    EXPECT_TRUE(absl::StrContains(d.status().message(), also)) << d.status();
  }

  bool gzip_ = true;
  std::string dir_, images_, labels_;
};

// Every case with gzip and with plain files.
class IdxTest : public IdxFixture, public testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    IdxFixture::SetUp();
    gzip_ = GetParam();
  }
};

TEST_P(IdxTest, RoundTrip) {
  WriteValid();
  absl::StatusOr<Dataset> d = LoadIdx(images_, labels_);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), kCount);
  EXPECT_EQ(d->rows, kRows);
  EXPECT_EQ(d->cols, kCols);
  EXPECT_EQ(d->num_classes, 10);
  EXPECT_EQ(d->pixels, Pixels());
  EXPECT_EQ(d->labels, Labels());
  EXPECT_TRUE(ValidateDataset(*d).ok());
}

TEST_P(IdxTest, EmptyDatasetLoads) {
  WriteFile(images_, ImagesFile(0, 28, 28, {}), gzip());
  WriteFile(labels_, LabelsFile(0, {}), gzip());
  absl::StatusOr<Dataset> d = LoadIdx(images_, labels_);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 0);
  EXPECT_EQ(d->rows, 28);
}

TEST_P(IdxTest, MissingFile) {
  WriteValid();
  ASSERT_EQ(std::remove(images_.c_str()), 0);
  ExpectError(absl::StatusCode::kNotFound, images_, "dataset-fashion-mnist");
  ExpectError(absl::StatusCode::kNotFound, images_, "tools/setup.sh");
  WriteValid();
  ASSERT_EQ(std::remove(labels_.c_str()), 0);
  ExpectError(absl::StatusCode::kNotFound, labels_);
}

TEST_P(IdxTest, Directory) {
  WriteValid();
  images_ = dir_;
  ExpectError(absl::StatusCode::kFailedPrecondition, dir_);
}

TEST_P(IdxTest, BadMagic) {
  WriteValid();
  WriteFile(images_, ImagesFile(kCount, kRows, kCols, Pixels(), 0xdeadbeef),
            gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, "magic");
  // The two files swapped.
  WriteFile(images_, LabelsFile(kCount, Labels()), gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, "labels file");
  WriteValid();
  WriteFile(labels_, LabelsFile(kCount, Labels(), 0x00000803), gzip());
  ExpectError(absl::StatusCode::kDataLoss, labels_, "magic");
}

TEST_P(IdxTest, TruncatedHeader) {
  WriteValid();
  WriteFile(images_, {0, 0, 8, 3, 0, 0}, gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, "header");
  WriteFile(images_, {}, gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, "header");
}

TEST_P(IdxTest, TruncatedPixels) {
  WriteValid();
  Bytes pixels = Pixels();
  pixels.resize(pixels.size() - 3);
  WriteFile(images_, ImagesFile(kCount, kRows, kCols, pixels), gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, "truncated");
}

TEST_P(IdxTest, TruncatedLabels) {
  WriteValid();
  WriteFile(labels_, LabelsFile(kCount, {1, 2}), gzip());
  ExpectError(absl::StatusCode::kDataLoss, labels_, "truncated");
}

TEST_P(IdxTest, TrailingBytes) {
  WriteValid();
  Bytes pixels = Pixels();
  pixels.push_back(0);
  WriteFile(images_, ImagesFile(kCount, kRows, kCols, pixels), gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, "trailing");
  WriteValid();
  Bytes labels = Labels();
  labels.push_back(0);
  WriteFile(labels_, LabelsFile(kCount, labels), gzip());
  ExpectError(absl::StatusCode::kDataLoss, labels_, "trailing");
}

TEST_P(IdxTest, CountMismatch) {
  WriteValid();
  Bytes labels = Labels();
  labels.pop_back();
  WriteFile(labels_, LabelsFile(kCount - 1, labels), gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, labels_);
}

TEST_P(IdxTest, HugeClaimsAreRejectedBeforeAllocating) {
  WriteValid();
  // Over the caps: refused from the header alone.
  WriteFile(images_, ImagesFile(0xffffffffu, 28, 28, Pixels()), gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, "limit");
  WriteFile(images_, ImagesFile(1u << 24, 28, 28, Pixels()), gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, "limit");
  WriteFile(images_, ImagesFile(1, 65536, 65536, Pixels()), gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, "65536x65536");
  WriteFile(images_, ImagesFile(kCount, 0, 28, Pixels()), gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, "0x28");

  // Under the caps (1M images of 28x28, 784 MB) but a tiny file: the loader
  // finds the data missing instead of allocating what the header says.
  const uint32_t huge = 1u << 20;
  WriteFile(images_, ImagesFile(huge, 28, 28, Pixels()), gzip());
  WriteFile(labels_, LabelsFile(huge, Bytes(huge, 0)), gzip());
  ExpectError(absl::StatusCode::kDataLoss, images_, "truncated");
  WriteFile(labels_, LabelsFile(huge, Labels()), gzip());
  ExpectError(absl::StatusCode::kDataLoss, labels_, "truncated");
}

TEST_P(IdxTest, LabelOutOfRange) {
  WriteValid();
  WriteFile(labels_, LabelsFile(kCount, {3, 0, 10, 1, 9}), gzip());
  ExpectError(absl::StatusCode::kDataLoss, labels_, "label 10 of example 2");

  absl::StatusOr<Dataset> d = LoadIdx(images_, labels_, /*num_classes=*/11);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->num_classes, 11);
  d = LoadIdx(images_, labels_, /*num_classes=*/4);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  d = LoadIdx(images_, labels_, /*num_classes=*/0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(GzipAndPlain, IdxTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& param_info) {
                           return param_info.param ? "Gzip" : "Plain";
                         });

class IdxGzipTest : public IdxFixture {};

TEST_F(IdxGzipTest, MixedCompression) {
  WriteFile(images_, ImagesFile(kCount, kRows, kCols, Pixels()), true);
  WriteFile(labels_, LabelsFile(kCount, Labels()), false);
  absl::StatusOr<Dataset> d = LoadIdx(images_, labels_);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->pixels, Pixels());
  EXPECT_EQ(d->labels, Labels());
}

// Enough varied pixels that the gzip stream is long.
Bytes NoisyPixels(size_t n) {
  Bytes p(n);
  uint32_t x = 12345;
  for (auto& v : p) {
    x = x * 1103515245u + 12345u;
    v = static_cast<uint8_t>(x >> 24);
  }
  return p;
}

TEST_F(IdxGzipTest, CorruptGzipStream) {
  const uint32_t count = 100;
  WriteFile(images_, ImagesFile(count, 28, 28, NoisyPixels(count * 784)), true);
  WriteFile(labels_, LabelsFile(count, Bytes(count, 1)), true);
  ASSERT_TRUE(LoadIdx(images_, labels_).ok());
  const Bytes good = ReadRaw(images_);
  ASSERT_GT(good.size(), 1000u);

  // Cut short: the stream ends early.
  Bytes cut(good.begin(), good.begin() + good.size() / 2);
  WriteFile(images_, cut, false);
  ExpectError(absl::StatusCode::kDataLoss, images_);

  // Only the gzip trailer (CRC and length) missing: all pixels are there.
  Bytes no_trailer(good.begin(), good.end() - 8);
  WriteFile(images_, no_trailer, false);
  ExpectError(absl::StatusCode::kDataLoss, images_, "unexpected end of file");

  // Bytes flipped in the middle: a bad stream or a CRC mismatch.
  Bytes flipped = good;
  for (size_t i = good.size() / 2; i < good.size() / 2 + 16; ++i) {
    flipped[i] ^= 0x5a;
  }
  WriteFile(images_, flipped, false);
  ExpectError(absl::StatusCode::kDataLoss, images_);
}

TEST(LoadFashionMnistTest, MissingDirectory) {
  absl::StatusOr<Dataset> d =
      LoadFashionMnist("/nonexistent/fashion-mnist", Split::kTest);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      absl::StrContains(d.status().message(),
                        "/nonexistent/fashion-mnist/t10k-images-idx3-ubyte.gz"))
      << d.status();
  EXPECT_TRUE(absl::StrContains(d.status().message(), "dataset-fashion-mnist"))
      << d.status();
}

TEST(LoadFashionMnistTest, ReadsUnpackedFiles) {
  std::string dir = testing::TempDir() + "/fmnist_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  WriteFile(dir + "/train-images-idx3-ubyte",
            ImagesFile(2, 28, 28, Bytes(2 * 784, 7)), false);
  WriteFile(dir + "/train-labels-idx1-ubyte", LabelsFile(2, {4, 5}), true);
  absl::StatusOr<Dataset> d = LoadFashionMnist(dir, Split::kTrain);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 2);
  EXPECT_EQ(d->labels, (Bytes{4, 5}));
}

void CheckRealSplit(Split split, int64_t size) {
  struct stat st;
  if (::stat(kDefaultFashionMnistDir, &st) != 0) {
    GTEST_SKIP() << kDefaultFashionMnistDir
                 << " is missing: install Debian's dataset-fashion-mnist "
                    "(tools/setup.sh does)";
  }
  absl::StatusOr<Dataset> d = LoadFashionMnist(kDefaultFashionMnistDir, split);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), size);
  EXPECT_EQ(d->rows, 28);
  EXPECT_EQ(d->cols, 28);
  EXPECT_EQ(d->num_classes, 10);
  ASSERT_EQ(d->pixels.size(), static_cast<size_t>(size * 784));
  std::array<int64_t, 10> per_class{};
  for (uint8_t label : d->labels) {
    ASSERT_LT(label, 10);
    ++per_class[label];
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], size / 10) << c;
  // Pixel statistics match the Batcher's default normalization.
  double sum = 0, sum2 = 0;
  for (uint8_t p : d->pixels) {
    sum += p / 255.0;
    sum2 += (p / 255.0) * (p / 255.0);
  }
  const double mean = sum / d->pixels.size();
  const double std = std::sqrt(sum2 / d->pixels.size() - mean * mean);
  EXPECT_NEAR(mean, 0.2860, 0.005);
  EXPECT_NEAR(std, 0.3530, 0.005);
}

TEST(LoadFashionMnistTest, RealTestSplit) {
  CheckRealSplit(Split::kTest, 10000);
}

TEST(LoadFashionMnistTest, RealTrainSplit) {
  CheckRealSplit(Split::kTrain, 60000);
}

}  // namespace
}  // namespace bnps::worker
