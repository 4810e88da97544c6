// XXH3 checksums and content ids, shared by the blob format, the store and the rings.
// Thread-safety: pure functions.
#ifndef CKPT_FORMAT_CHECKSUM_H_
#define CKPT_FORMAT_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ckpt {

// XXH3-64 of `size` bytes at `data` (seed 0).
uint64_t Xxh3_64(const void* data, size_t size);

// A 128-bit content id: XXH3-128 of a blob. Stored big-endian (hi, then lo) as
// 16 bytes in keys, printed as 32 lowercase hex digits.
struct BlobId {
  uint64_t hi = 0;
  uint64_t lo = 0;

  static BlobId Of(const void* data, size_t size);
  // 16 raw bytes, big-endian.
  std::string Bytes() const;
  // REQUIRES: bytes.size() == 16. Returns false otherwise.
  static bool FromBytes(std::string_view bytes, BlobId* out);
  std::string Hex() const;
  // Parses 32 hex digits; returns false on anything else.
  static bool FromHex(std::string_view hex, BlobId* out);

  friend bool operator==(const BlobId& a, const BlobId& b) { return a.hi == b.hi && a.lo == b.lo; }
  friend bool operator!=(const BlobId& a, const BlobId& b) { return !(a == b); }
  friend bool operator<(const BlobId& a, const BlobId& b) {
    return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
  }
};

// 16 lowercase hex digits of a 64-bit value, and back (false on bad input).
std::string HexU64(uint64_t v);
bool ParseHexU64(std::string_view hex, uint64_t* out);

}  // namespace ckpt

#endif  // CKPT_FORMAT_CHECKSUM_H_
