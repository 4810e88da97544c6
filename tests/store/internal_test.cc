// Internals of store/src that the API tests cannot pin down on their own.
#include <gtest/gtest.h>

#include <string>

#include "ckpt/format/checksum.h"
#include "keys.h"

namespace ckpt::store {
namespace {

TEST(KeysTest, LayoutSortsVersionsNumericallyAndParsesBack) {
  EXPECT_LT(keys::Manifest("e", "m", 255), keys::Manifest("e", "m", 256));
  EXPECT_LT(keys::Manifest("e", "m", 1 << 20), keys::Manifest("e", "m0", 0));
  std::string exp, member;
  int64_t version = 0;
  ASSERT_TRUE(keys::ParseManifest(keys::Manifest("exp-1", "m.7", 0x0100), &exp, &member, &version));
  EXPECT_EQ(exp, "exp-1");
  EXPECT_EQ(member, "m.7");
  EXPECT_EQ(version, 0x0100);
  const std::string prefix = keys::ExperimentPrefix("e");
  EXPECT_LT(keys::Event("e", ~uint64_t{0}), keys::PrefixEnd(prefix));
  EXPECT_GT(keys::Event("e", 0), prefix);
  EXPECT_FALSE(keys::ValidateId("id", "a/b").ok());
  EXPECT_FALSE(keys::ValidateId("id", std::string(129, 'a')).ok());
  EXPECT_TRUE(keys::ValidateId("id", "A-z_0.9:x").ok());
  int64_t n = 0;
  ASSERT_TRUE(keys::DecodeCount(keys::EncodeCount(-3), &n));
  EXPECT_EQ(n, -3);
}

}  // namespace
}  // namespace ckpt::store
