#include "util/safetensors.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace bnps::util {
namespace {

std::string LittleEndian64(uint64_t n) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

TEST(SafetensorsTest, LayoutIsLengthHeaderThenDataInNameOrder) {
  const float f[2] = {1.5f, -2.0f};
  const int64_t i = 7;
  std::map<std::string, SafeTensor> tensors;
  tensors["b"] = {"F32", {2}, std::string(reinterpret_cast<const char*>(f), 8)};
  tensors["a"] = {"I64", {}, std::string(reinterpret_cast<const char*>(&i), 8)};
  absl::StatusOr<std::string> bytes =
      EncodeSafetensors(tensors, {{"format", "pt"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}";
  const size_t padded = (header.size() + 7) / 8 * 8;
  ASSERT_EQ(bytes->size(), 8 + padded + 16);
  EXPECT_EQ(bytes->substr(0, 8), LittleEndian64(padded));
  EXPECT_EQ(bytes->substr(8, header.size()), header);
  EXPECT_EQ(bytes->substr(8 + header.size(), padded - header.size()),
            std::string(padded - header.size(), ' '));
  EXPECT_EQ(bytes->substr(8 + padded, 8), tensors["a"].data);
  EXPECT_EQ(bytes->substr(16 + padded), tensors["b"].data);
}

TEST(SafetensorsTest, NamesAreEscaped) {
  std::map<std::string, SafeTensor> tensors;
  tensors["q\"\\\n"] = {"F64", {0}, ""};
  absl::StatusOr<std::string> bytes = EncodeSafetensors(tensors);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_NE(bytes->find("\"q\\\"\\\\\\u000a\":"), std::string::npos) << *bytes;
}

TEST(SafetensorsTest, RefusesWhatItCannotWrite) {
  for (const auto& [name, t] : std::map<std::string, SafeTensor>{
           {"dtype", {"BF16", {1}, "xx"}},
           {"size", {"F32", {2}, "four"}},
           {"negative", {"F32", {-1}, ""}},
           {"__metadata__", {"F32", {0}, ""}}}) {
    EXPECT_EQ(EncodeSafetensors({{name, t}}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
}

TEST(SafetensorsTest, WritesAtomically) {
  char tmpl[] = "/tmp/safetensors_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/out.safetensors";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  std::ifstream in(path);
  std::stringstream got;
  got << in.rdbuf();
  EXPECT_EQ(got.str(), "second");
  EXPECT_EQ(WriteFileAtomically(std::string(tmpl) + "/no/such/dir/x", "x")
                .code(),
            absl::StatusCode::kUnavailable);
  std::remove(path.c_str());
  rmdir(tmpl);
}

}  // namespace
}  // namespace bnps::util
