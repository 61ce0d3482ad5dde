#include "bn/shape.h"

#include "gtest/gtest.h"

namespace bnps::bn {
namespace {

TEST(ShapeTest, Counts) {
  const Shape s{4, 3, 5, 7};
  EXPECT_EQ(s.Spatial(), 35);
  EXPECT_EQ(s.PerChannel(), 140);
  EXPECT_EQ(s.Elements(), 420);
  EXPECT_EQ(s.ToString(), "[4, 3, 5, 7]");
}

TEST(ShapeTest, EmptyBatchIsValid) {
  EXPECT_TRUE(ValidateShape(Shape{0, 8, 4, 4}).ok());
  EXPECT_TRUE(ValidateShape(Shape{1, 1, 1, 1}).ok());
}

TEST(ShapeTest, RejectsBadDimensions) {
  EXPECT_EQ(ValidateShape(Shape{2, 0, 1, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateShape(Shape{-1, 2, 1, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateShape(Shape{2, 2, -3, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateShape(Shape{1 << 20, 1 << 20, 1 << 20, 1}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bnps::bn
