// Import's readers of foreign states (tools/src/foreign_state.h): the limits
// of a safetensors file (docs/LIMITS.md) at their value and one past, and the
// shapes of .pt objects that are refused with a Corruption.
#include "foreign_state.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "format/tensor_files.h"

namespace ckpt::tool {
namespace {

using testing::SafetensorsFile;

std::string Tensor(const std::string& shape, size_t bytes) {
  return R"({"t":{"dtype":"U8","shape":)" + shape + R"(,"data_offsets":[0,)" +
         std::to_string(bytes) + "]}}";
}

void ExpectCorruption(const std::string& file, const std::string& needle) {
  auto st = ParseSafetensors(file, "f.safetensors");
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(st.status().IsCorruption()) << st.status().ToString();
  EXPECT_NE(st.status().message().find(needle), std::string::npos)
      << "'" << st.status().message() << "' lacks '" << needle << "'";
}

TEST(ForeignStateTest, ReadsASafetensorsFile) {
  auto st = ParseSafetensors(SafetensorsFile(Tensor("[2,3]", 6), "abcdef"), "f.safetensors");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->tensors.count("t"), 1u);
  EXPECT_EQ(st->tensors["t"].data, "abcdef");
  EXPECT_EQ(st->tensors["t"].shape, (std::vector<int64_t>{2, 3}));
}

TEST(ForeignStateTest, HeaderLengthAtAndPastTheLimit) {
  // A header of exactly 16 MiB (JSON padded with spaces, as the format allows).
  std::string header = Tensor("[1]", 1);
  header += std::string(format::kDefaultMaxHeaderBytes - header.size(), ' ');
  auto st = ParseSafetensors(SafetensorsFile(header, "x"), "f.safetensors");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  header += " ";
  ExpectCorruption(SafetensorsFile(header, "x"),
                   "f.safetensors: header length 16777217 is above the limit of 16777216 bytes");
  ExpectCorruption(SafetensorsFile(Tensor("[1]", 1), "x").substr(0, 20), "exceeds the file");
}

TEST(ForeignStateTest, RankAtAndPastTheLimit) {
  auto st = ParseSafetensors(SafetensorsFile(Tensor("[1,1,1,1,1,1,1,1]", 1), "x"), "f.safetensors");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectCorruption(SafetensorsFile(Tensor("[1,1,1,1,1,1,1,1,1]", 1), "x"),
                   "tensor t: rank above 8");
}

TEST(ForeignStateTest, ElementsAtAndPastTheLimit) {
  // 2^40 elements is a shape the reader accepts (the file then lacks its bytes).
  ExpectCorruption(SafetensorsFile(Tensor("[1099511627776]", 1), "x"),
                   "1 bytes for U8 [1099511627776]");
  ExpectCorruption(SafetensorsFile(Tensor("[1099511627777]", 1), "x"), "tensor t: bad shape");
  ExpectCorruption(SafetensorsFile(Tensor("[1048576,1048577]", 1), "x"),
                   "tensor t: shape too large");
}

TEST(ForeignStateTest, OffsetsOutsideTheDataAreRefused) {
  ExpectCorruption(SafetensorsFile(Tensor("[4]", 4), "abc"), "outside the 3 data bytes");
  ExpectCorruption(
      SafetensorsFile(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "x"), "outside");
  ExpectCorruption(SafetensorsFile(R"({"t":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}})", "x"),
                   "unknown dtype");
  ExpectCorruption(SafetensorsFile("[1]", ""), "the header is not a JSON object");
}

TEST(ForeignStateTest, PtObjectsOfAnotherShapeAreRefused) {
  auto st = StateFromPt(MakeList(), "f.pt", {}, format::OptimizerKind::kSgd);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(st.status().IsCorruption()) << st.status().ToString();
  PyRef d = MakeDict();
  DictSet(d.get(), MakeString("w"), MakeInt(3));
  st = StateFromPt(d, "f.pt", {}, format::OptimizerKind::kSgd);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("entry w is not a tensor"), std::string::npos)
      << st.status().ToString();
  st = StateFromPt(nullptr, "f.pt", {}, format::OptimizerKind::kSgd);
  EXPECT_FALSE(st.ok());
}

}  // namespace
}  // namespace ckpt::tool
