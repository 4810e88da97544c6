#include "ckpt/format/checksum.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace ckpt {
namespace {

// The runtime-dispatched XXH3 must give the portable reference values at every
// size class (XXH3 switches code paths at 16, 128, 240 bytes and at stripe and
// block sizes).
TEST(ChecksumTest, DispatchedXxh3EqualsThePortableReference) {
  std::mt19937_64 rng(7);
  std::string bytes(3 << 20, '\0');
  for (auto& c : bytes) c = static_cast<char>(rng());
  for (size_t n : {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 65536, 1 << 20,
                   (3 << 20) - 1}) {
    EXPECT_EQ(Xxh3_64(bytes.data(), n), XXH3_64bits(bytes.data(), n)) << n;
    XXH128_hash_t h = XXH3_128bits(bytes.data(), n);
    EXPECT_EQ(BlobId::Of(bytes.data(), n), (BlobId{h.high64, h.low64})) << n;
  }
}

TEST(ChecksumTest, BlobIdRoundTripsThroughBytesAndHex) {
  const BlobId id = BlobId::Of("ckpt", 4);
  BlobId back;
  ASSERT_TRUE(BlobId::FromBytes(id.Bytes(), &back));
  EXPECT_EQ(back, id);
  ASSERT_TRUE(BlobId::FromHex(id.Hex(), &back));
  EXPECT_EQ(back, id);
  EXPECT_EQ(id.Hex().size(), 32u);
  EXPECT_FALSE(BlobId::FromHex("xyz", &back));
  EXPECT_FALSE(BlobId::FromHex(std::string(32, 'g'), &back));
  EXPECT_FALSE(BlobId::FromBytes("short", &back));
  uint64_t v;
  EXPECT_FALSE(ParseHexU64("", &v));
  EXPECT_TRUE(ParseHexU64(HexU64(0xfeedfacecafebeefULL), &v));
  EXPECT_EQ(v, 0xfeedfacecafebeefULL);
}

}  // namespace
}  // namespace ckpt
