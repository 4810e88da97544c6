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

}  // namespace ckpt::ipc::internal
