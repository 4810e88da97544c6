#include "ckpt/base/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace ckpt {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd " + std::to_string(x));
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  CKPT_ASSIGN_OR_RETURN(int h, Half(x));
  CKPT_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  CKPT_RETURN_IF_ERROR(Half(x).status());
  return Status::OK();
}

TEST(StatusTest, OkAndErrorsCarryCodeAndMessage) {
  EXPECT_TRUE(Status::OK().ok());
  EXPECT_EQ(Status::OK().ToString(), "OK");
  Status s = Status::Corruption("tensor conv1.weight checksum mismatch");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_EQ(s.ToString(), "Corruption: tensor conv1.weight checksum mismatch");
  EXPECT_EQ(s.WithPrefix("member 7 v12").message(),
            "member 7 v12: tensor conv1.weight checksum mismatch");
  EXPECT_TRUE(Status::OK().WithPrefix("x").ok());
}

TEST(StatusTest, MacrosPropagateTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "odd 3");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_TRUE(CheckEven(5).IsInvalidArgument());
}

TEST(StatusTest, StatusOrHoldsMoveOnlyValues) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(3);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> v = std::move(p).value();
  EXPECT_EQ(*v, 3);
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  StatusOr<int> r = Status::NotFound("member m3");
  EXPECT_DEATH((void)r.value(), "member m3");
}

}  // namespace
}  // namespace ckpt
