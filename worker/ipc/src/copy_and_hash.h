// The body of CopyAndXxh3 (payload_checksum.h), included by the translation
// unit of each instruction set it is compiled for (the default one in
// payload_checksum.cc, -mavx2 in payload_checksum_avx2.cc), so xxhash's
// streaming code is inlined with that unit's vector width.
//
// Thread-safety: pure function (its XXH3 state lives on the stack).
#ifndef CKPT_IPC_SRC_COPY_AND_HASH_H_
#define CKPT_IPC_SRC_COPY_AND_HASH_H_

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ckpt::ipc::internal {
namespace {

// Small enough that a copied chunk is still in L1 (32 KiB or more on every
// x86 core this runs on) when it is hashed; large enough that the per-call
// cost of XXH3's streaming update is noise.
constexpr size_t kCopyHashChunk = 16 * 1024;

// XXH3's streaming digest equals its one-shot value for the same bytes, so a
// receiver checking with PayloadXxh3 agrees with a sender using this.
[[maybe_unused]] uint64_t CopyAndXxh3Generic(void* dst, const void* src, size_t size) {
  if (size <= kCopyHashChunk) {
    if (size != 0) std::memcpy(dst, src, size);
    return XXH3_64bits(dst, size);
  }
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t off = 0; off < size; off += kCopyHashChunk) {
    const size_t n = std::min(kCopyHashChunk, size - off);
    std::memcpy(d + off, s + off, n);
    XXH3_64bits_update(&state, d + off, n);
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace
}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_COPY_AND_HASH_H_
