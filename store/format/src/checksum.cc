#include "ckpt/format/checksum.h"

// libxxhash's runtime-dispatched XXH3 picks the widest vector unit the CPU has
// (AVX2 / AVX-512): about 3x the portable code on these machines, same values.
#include <xxh_x86dispatch.h>

namespace ckpt {

uint64_t Xxh3_64(const void* data, size_t size) { return XXH3_64bits_dispatch(data, size); }

BlobId BlobId::Of(const void* data, size_t size) {
  XXH128_hash_t h = XXH3_128bits_dispatch(data, size);
  return BlobId{h.high64, h.low64};
}

std::string BlobId::Bytes() const {
  std::string out(16, '\0');
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>(hi >> (56 - 8 * i));
    out[8 + i] = static_cast<char>(lo >> (56 - 8 * i));
  }
  return out;
}

bool BlobId::FromBytes(std::string_view bytes, BlobId* out) {
  if (bytes.size() != 16) return false;
  uint64_t h = 0, l = 0;
  for (int i = 0; i < 8; ++i) {
    h = (h << 8) | static_cast<uint8_t>(bytes[i]);
    l = (l << 8) | static_cast<uint8_t>(bytes[8 + i]);
  }
  *out = BlobId{h, l};
  return true;
}

std::string BlobId::Hex() const { return HexU64(hi) + HexU64(lo); }

bool BlobId::FromHex(std::string_view hex, BlobId* out) {
  if (hex.size() != 32) return false;
  BlobId id;
  if (!ParseHexU64(hex.substr(0, 16), &id.hi) || !ParseHexU64(hex.substr(16), &id.lo)) {
    return false;
  }
  *out = id;
  return true;
}

std::string HexU64(uint64_t v) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i) {
    s[i] = kDigits[v & 0xf];
    v >>= 4;
  }
  return s;
}

bool ParseHexU64(std::string_view hex, uint64_t* out) {
  if (hex.empty() || hex.size() > 16) return false;
  uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

}  // namespace ckpt
