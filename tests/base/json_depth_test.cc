#include "ckpt/base/json_depth.h"

#include <gtest/gtest.h>

#include <string>

namespace ckpt::base {
namespace {

TEST(JsonDepthTest, CountsTheDeepestArrayOrObject) {
  EXPECT_EQ(JsonDepth("42", 8), 0);
  EXPECT_EQ(JsonDepth("[]", 8), 1);
  EXPECT_EQ(JsonDepth(R"({"a":[1,{"b":2}],"c":[]})", 8), 3);
  EXPECT_EQ(JsonDepth("[[]][[[]]]", 8), 3);
}

TEST(JsonDepthTest, IgnoresBracketsInsideStrings) {
  EXPECT_EQ(JsonDepth(R"({"k":"[[[{{{"})", 8), 1);
  // An escaped quote does not end the string; an escaped backslash does not
  // escape the quote after it.
  EXPECT_EQ(JsonDepth(R"(["\"[[[", "\\", [1]])", 8), 2);
}

TEST(JsonDepthTest, StopsPastTheLimitAndSaysSo) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(JsonDepth(deep, 16), 17);
  EXPECT_EQ(JsonDepth(std::string(16, '[') + std::string(16, ']'), 16), 16);
  // Unbalanced or invalid text still gets a depth: the parser reports the rest.
  EXPECT_EQ(JsonDepth("[[]]]]{", 4), 2);
}

}  // namespace
}  // namespace ckpt::base
