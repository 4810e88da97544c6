#include "payload_checksum.h"

#include "ckpt/format/checksum.h"

namespace ckpt::ipc::internal {

#if defined(__x86_64__) && defined(CKPT_IPC_HAVE_AVX2_TU)
// In payload_checksum_avx2.cc, compiled with -mavx2.
uint64_t PayloadXxh3Avx2(const void* data, size_t size);

namespace {
using Fn = uint64_t (*)(const void*, size_t);
Fn Pick() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) return &PayloadXxh3Avx2;
  return [](const void* data, size_t size) { return Xxh3_64(data, size); };
}
}  // namespace

uint64_t PayloadXxh3(const void* data, size_t size) {
  static const Fn fn = Pick();
  return fn(data, size);
}
#else
uint64_t PayloadXxh3(const void* data, size_t size) { return Xxh3_64(data, size); }
#endif

}  // namespace ckpt::ipc::internal
