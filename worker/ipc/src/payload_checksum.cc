#include "payload_checksum.h"

#include "ckpt/base/cpu_features.h"
#include "ckpt/format/checksum.h"
#include "copy_and_hash.h"

namespace ckpt::ipc::internal {

#if defined(__x86_64__) && defined(CKPT_IPC_HAVE_AVX2_TU)
// In payload_checksum_avx2.cc, compiled with -mavx2.
uint64_t PayloadXxh3Avx2(const void* data, size_t size);
uint64_t CopyAndXxh3Avx2(void* dst, const void* src, size_t size);
uint64_t GatherAndXxh3Avx2(void* dst, const PayloadPart* parts, size_t count, uint64_t offset,
                           size_t size);

namespace {
using Fn = uint64_t (*)(const void*, size_t);
using CopyFn = uint64_t (*)(void*, const void*, size_t);
using GatherFn = uint64_t (*)(void*, const PayloadPart*, size_t, uint64_t, size_t);
bool HaveAvx2() { return base::CpuFeaturesOfThisHost().avx2; }
Fn Pick() {
  if (HaveAvx2()) return &PayloadXxh3Avx2;
  return [](const void* data, size_t size) { return Xxh3_64(data, size); };
}
CopyFn PickCopy() { return HaveAvx2() ? &CopyAndXxh3Avx2 : &CopyAndXxh3Generic; }
GatherFn PickGather() { return HaveAvx2() ? &GatherAndXxh3Avx2 : &GatherAndXxh3Generic; }
}  // namespace

uint64_t PayloadXxh3(const void* data, size_t size) {
  static const Fn fn = Pick();
  return fn(data, size);
}

uint64_t CopyAndXxh3(void* dst, const void* src, size_t size) {
  static const CopyFn fn = PickCopy();
  return fn(dst, src, size);
}

uint64_t GatherAndXxh3(void* dst, const PayloadPart* parts, size_t count, uint64_t offset,
                       size_t size) {
  static const GatherFn fn = PickGather();
  return fn(dst, parts, count, offset, size);
}
#else
uint64_t PayloadXxh3(const void* data, size_t size) { return Xxh3_64(data, size); }

uint64_t CopyAndXxh3(void* dst, const void* src, size_t size) {
  return CopyAndXxh3Generic(dst, src, size);
}

uint64_t GatherAndXxh3(void* dst, const PayloadPart* parts, size_t count, uint64_t offset,
                       size_t size) {
  return GatherAndXxh3Generic(dst, parts, count, offset, size);
}
#endif

}  // namespace ckpt::ipc::internal
