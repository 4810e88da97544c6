// Little-endian loads and stores of the integers in ckpt::format's byte
// layouts (safetensors' header length, zip and .npy fields), from bytes of
// any alignment (private to ckpt::format).
#ifndef CKPT_FORMAT_LITTLE_ENDIAN_H_
#define CKPT_FORMAT_LITTLE_ENDIAN_H_

#include <cstdint>

namespace ckpt::format::internal {

inline uint16_t LoadLE16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

inline uint32_t LoadLE32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

inline uint64_t LoadLE64(const uint8_t* p) {
  return LoadLE32(p) | (uint64_t{LoadLE32(p + 4)} << 32);
}

inline void StoreLE64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace ckpt::format::internal

#endif  // CKPT_FORMAT_LITTLE_ENDIAN_H_
