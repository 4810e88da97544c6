// Compiled with -mavx2 (worker/ipc/CMakeLists.txt) and called only when the
// CPU supports AVX2 (payload_checksum.cc). XXH3's result does not depend on
// the vector width.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

#include "copy_and_hash.h"

namespace ckpt::ipc::internal {

uint64_t PayloadXxh3Avx2(const void* data, size_t size) { return XXH3_64bits(data, size); }

uint64_t CopyAndXxh3Avx2(void* dst, const void* src, size_t size) {
  return CopyAndXxh3Generic(dst, src, size);
}

uint64_t GatherAndXxh3Avx2(void* dst, const PayloadPart* parts, size_t count, uint64_t offset,
                           size_t size) {
  return GatherAndXxh3Generic(dst, parts, count, offset, size);
}

}  // namespace ckpt::ipc::internal
