// CopyAndXxh3 (worker/ipc/src/payload_checksum.h): the one-pass copy and
// checksum the ring's send path and fragment assembly use must give exactly
// the bytes and the checksum of a plain copy followed by PayloadXxh3 and
// ckpt::Xxh3_64, at every size around its chunk boundary and at unaligned
// addresses, or a receiver would reject every fragment.
#include "payload_checksum.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "ckpt/format/checksum.h"

namespace ckpt::ipc::internal {
namespace {

TEST(PayloadChecksumTest, CopyAndXxh3EqualsACopyThenXxh3AtEverySize) {
  constexpr size_t kChunk = 16 * 1024;
  const std::vector<size_t> sizes = {0,
                                     1,
                                     63,
                                     64,
                                     kChunk - 1,
                                     kChunk,
                                     kChunk + 1,
                                     2 * kChunk,
                                     3 * kChunk + 7,
                                     1000003,
                                     (size_t{1} << 20) + 64};
  std::mt19937_64 rng(7);
  for (size_t size : sizes) {
    for (size_t misalign : {0, 1, 13}) {
      std::vector<uint8_t> src(size + 16), dst(size + 16, 0xAA);
      for (auto& b : src) b = static_cast<uint8_t>(rng());
      const uint8_t* from = src.data() + misalign;
      uint8_t* to = dst.data() + (misalign * 3) % 16;
      const uint64_t h = CopyAndXxh3(to, from, size);
      SCOPED_TRACE("size " + std::to_string(size) + ", misaligned by " + std::to_string(misalign));
      EXPECT_EQ(h, Xxh3_64(from, size));
      EXPECT_EQ(h, PayloadXxh3(from, size));
      ASSERT_TRUE(std::equal(from, from + size, to));
      // Nothing past the end is written.
      const size_t after = (to - dst.data()) + size;
      for (size_t i = after; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xAA) << i;
    }
  }
}

TEST(PayloadChecksumTest, CopyAndXxh3ChangesWithAnyByte) {
  std::vector<uint8_t> src(3 * 16 * 1024 + 5, 1), dst(src.size());
  const uint64_t base = CopyAndXxh3(dst.data(), src.data(), src.size());
  for (size_t i : {size_t{0}, size_t{16383}, size_t{16384}, src.size() - 1}) {
    src[i] ^= 0x40;
    EXPECT_NE(CopyAndXxh3(dst.data(), src.data(), src.size()), base) << i;
    src[i] ^= 0x40;
  }
}

}  // namespace
}  // namespace ckpt::ipc::internal
