// ParseSafetensors reads the header in one SAX pass (safetensors_header.h);
// these hold it to what a parsed JSON object holds: a later duplicate of a
// key replaces the earlier one, a tensor's other keys are skipped whatever
// they hold, and every value that is not what a field needs is named.
#include "ckpt/format/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "format/tensor_files.h"

namespace ckpt::format {
namespace {

using testing::SafetensorsFile;

StatusOr<SafetensorsView> Parse(const std::string& file) {
  SafetensorsOptions o;
  o.origin = "f";
  return ParseSafetensors(file.data(), file.size(), o);
}

void ExpectRefused(const std::string& header, const std::string& data, const std::string& message) {
  const std::string file = SafetensorsFile(header, data);
  auto v = Parse(file);
  ASSERT_FALSE(v.ok()) << header;
  EXPECT_TRUE(v.status().IsCorruption()) << v.status().ToString();
  EXPECT_EQ(v.status().message(), message) << header;
}

TEST(SafetensorsTest, ReadsTensorsInDataOrderAndTheMetadata) {
  const std::string file =
      SafetensorsFile(R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                      R"("__metadata__":{"k":"v","a":""},)"
                      R"("a":{"shape":[1,1],"data_offsets":[2,3],"dtype":"U8"}})",
                      "xyz");
  auto v = Parse(file);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_EQ(v->tensors.size(), 2u);
  EXPECT_EQ(v->tensors[0].name, "b");
  EXPECT_EQ(v->tensors[1].name, "a");
  EXPECT_EQ(v->tensors[1].shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(v->tensors[1].data, reinterpret_cast<const uint8_t*>(file.data()) + file.size() - 1);
  EXPECT_TRUE(v->has_metadata);
  EXPECT_EQ(v->metadata, (std::map<std::string, std::string>{{"a", ""}, {"k", "v"}}));
}

TEST(SafetensorsTest, ALaterDuplicateKeyReplacesTheEarlierOne) {
  // A tensor's entry, one of its fields, a metadata value, __metadata__.
  auto v = Parse(SafetensorsFile(R"({"t":{"dtype":"F32","shape":[9],"data_offsets":[0,36]},)"
                                 R"("t":{"dtype":"F32","dtype":"U8","shape":[5],"shape":[2],)"
                                 R"("data_offsets":[0,2]},)"
                                 R"("__metadata__":{"gone":"1"},)"
                                 R"("__metadata__":{"k":"1","k":"2"}})",
                                 "ab"));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_EQ(v->tensors.size(), 1u);
  EXPECT_EQ(v->tensors[0].dtype, DType::kU8);
  EXPECT_EQ(v->tensors[0].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(v->metadata, (std::map<std::string, std::string>{{"k", "2"}}));
  // The later entry is the whole entry: nothing of the earlier one is left.
  ExpectRefused(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                R"("t":{"shape":[1],"data_offsets":[0,1]}})",
                "a", "f: tensor t: missing or non-string dtype");
  // A good field replaced by a bad one is bad.
  ExpectRefused(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"dtype":7}})", "a",
                "f: tensor t: missing or non-string dtype");
  ExpectRefused(R"({"__metadata__":{"k":"v"},"__metadata__":[]})", "",
                "f: __metadata__ is not an object");
}

TEST(SafetensorsTest, ATensorsOtherKeysAreSkippedWhateverTheyHold) {
  auto v = Parse(SafetensorsFile(R"({"t":{"x":{"shape":[-1],"dtype":[],"data_offsets":{}},)"
                                 R"("dtype":"U8","y":[[1,[2]],{"z":null}],"shape":[1],)"
                                 R"("data_offsets":[0,1],"w":-1.5e3}})",
                                 "a"));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->tensors[0].shape, (std::vector<int64_t>{1}));
  EXPECT_FALSE(v->has_metadata);
}

TEST(SafetensorsTest, EveryValueThatIsNotWhatAFieldNeedsIsNamed) {
  for (const char* dim :
       {"-1", "1.0", "1e0", "\"1\"", "[1]", "{}", "null", "true", "18446744073709551616"}) {
    ExpectRefused(
        std::string(R"({"t":{"dtype":"U8","shape":[)") + dim + R"(],"data_offsets":[0,1]}})", "a",
        "f: tensor t: shape has a non-natural dimension");
  }
  for (const char* off : {"-0", "0.5", "[0]", "\"0\""}) {
    ExpectRefused(std::string(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[)") + off + ",1]}}",
                  "a", "f: tensor t: data_offsets are not natural numbers");
  }
  ExpectRefused(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,[1,2]]}})", "a",
                "f: tensor t: data_offsets are not natural numbers");
  ExpectRefused(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1,[]]}})", "a",
                "f: tensor t: data_offsets is not a pair");
  ExpectRefused(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":{"0":1}}})", "a",
                "f: tensor t: data_offsets is not a pair");
  // A long array is refused by its length (and not held while it is read).
  std::string long_shape = "[1";
  for (int i = 1; i < 1000000; ++i) long_shape += ",1";
  ExpectRefused(R"({"t":{"dtype":"U8","shape":)" + long_shape + R"(],"data_offsets":[0,1]}})", "a",
                "f: tensor t: rank 1000000 above 8");
  ExpectRefused(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2,3,4,5,6,7,8,9,1]}})", "a",
                "f: tensor t: data_offsets is not a pair");
  ExpectRefused(R"({"t":{"dtype":"U8","shape":{},"data_offsets":[0,1]}})", "a",
                "f: tensor t: missing or non-array shape");
  ExpectRefused(R"({"t":{"shape":[1],"data_offsets":[0,1]}})", "a",
                "f: tensor t: missing or non-string dtype");
  ExpectRefused(R"({"t":{"dtype":["U8"],"shape":[1],"data_offsets":[0,1]}})", "a",
                "f: tensor t: missing or non-string dtype");
  ExpectRefused(R"({"t":[]})", "", "f: tensor t: entry is not an object");
  ExpectRefused(R"({"t":"U8"})", "", "f: tensor t: entry is not an object");
  // The first fault in key order is the one named.
  ExpectRefused(R"({"z":1,"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":null})", "a",
                "f: tensor a: entry is not an object");
  ExpectRefused(R"({"__metadata__":{"b":"x","a":{"s":"t"}}})", "",
                "f: __metadata__ value of a is not a string");
  ExpectRefused(R"({"__metadata__":{"a":1}})", "", "f: __metadata__ value of a is not a string");
  ExpectRefused(R"({"__metadata__":"k=v"})", "", "f: __metadata__ is not an object");
}

TEST(SafetensorsTest, TheHeaderIsOneJsonObjectAndNothingElse) {
  ExpectRefused(R"([{"t":{}}])", "", "f: header is not a JSON object");
  ExpectRefused(R"("t")", "", "f: header is not a JSON object");
  ExpectRefused("{} {}", "", "f: header is not valid JSON");
  ExpectRefused(R"({"t":{"dtype":"U8",}})", "", "f: header is not valid JSON");
  ExpectRefused(R"({"t":{"dtype":"U8")", "", "f: header is not valid JSON");
  ExpectRefused("{\"t\xff\":{}}", "", "f: header is not valid JSON");
  ExpectRefused("", "", "f: header is not valid JSON");
  // Deeply nested values (skipped ones too) take no stack of their own.
  const std::string deep(100000, '[');
  ExpectRefused(R"({"t":{"x":)" + deep, "", "f: header is not valid JSON");
  auto v = Parse(SafetensorsFile(R"({"t":{"x":)" + deep + std::string(100000, ']') +
                                     R"(,"dtype":"U8","shape":[],"data_offsets":[0,1]}})",
                                 "a"));
  EXPECT_TRUE(v.ok()) << v.status().ToString();
}

}  // namespace
}  // namespace ckpt::format
