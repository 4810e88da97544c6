// The bodies of CopyAndXxh3 and GatherAndXxh3 (payload_checksum.h), included by the translation
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

#include "payload_checksum.h"

namespace ckpt::ipc::internal {
namespace {

// Small enough that a copied chunk is still in L1 (32 KiB or more on every
// x86 core this runs on) when it is hashed; large enough that the per-call
// cost of XXH3's streaming update is noise.
constexpr size_t kCopyHashChunk = 16 * 1024;

// Copies bytes [offset, offset + size) of the concatenation of `parts` to
// `dst` and returns their XXH3. XXH3's streaming digest equals its one-shot
// value for the same bytes, so a receiver checking with PayloadXxh3 agrees
// with a sender using this. REQUIRES: the parts hold offset + size bytes.
[[maybe_unused]] uint64_t GatherAndXxh3Generic(void* dst, const PayloadPart* parts, size_t count,
                                               uint64_t offset, size_t size) {
  auto* d = static_cast<uint8_t*>(dst);
  const bool one_shot = size <= kCopyHashChunk;
  XXH3_state_t state;
  if (!one_shot) {
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset(&state);
  }
  size_t done = 0;
  for (size_t i = 0; i < count && done < size; ++i) {
    uint64_t n = parts[i].size;
    if (offset >= n) {
      offset -= n;
      continue;
    }
    const auto* s = static_cast<const uint8_t*>(parts[i].data) + offset;
    n = std::min<uint64_t>(n - offset, size - done);
    offset = 0;
    for (uint64_t off = 0; off < n; off += kCopyHashChunk) {
      const size_t c = static_cast<size_t>(std::min<uint64_t>(kCopyHashChunk, n - off));
      std::memcpy(d + done, s + off, c);
      if (!one_shot) XXH3_64bits_update(&state, d + done, c);
      done += c;
    }
  }
  return one_shot ? XXH3_64bits(dst, size) : XXH3_64bits_digest(&state);
}

[[maybe_unused]] uint64_t CopyAndXxh3Generic(void* dst, const void* src, size_t size) {
  const PayloadPart part{src, size};
  return GatherAndXxh3Generic(dst, &part, 1, 0, size);
}

}  // namespace
}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_COPY_AND_HASH_H_
