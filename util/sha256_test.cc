#include "util/sha256.h"

#include "gtest/gtest.h"

namespace bnps::util {
namespace {

// FIPS 180-2's examples.
TEST(Sha256Test, KnownAnswers) {
  EXPECT_EQ(Hex(Sha256Of("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex(Sha256Of("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Test, IncrementalEqualsWhole) {
  Sha256 h;
  h.Update("ab");
  h.Update("");
  h.Update("c");
  EXPECT_EQ(h.Final(), Sha256Of("abc"));
}

}  // namespace
}  // namespace bnps::util
