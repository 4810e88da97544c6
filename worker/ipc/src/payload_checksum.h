// XXH3-64 of record payloads: the same value as ckpt::Xxh3_64, computed with
// AVX2 when the CPU has it. Payload checksums are two of the passes over every
// byte a record costs (producer and consumer), so their speed is the ring's.
//
// Thread-safety: pure function.
#ifndef CKPT_IPC_SRC_PAYLOAD_CHECKSUM_H_
#define CKPT_IPC_SRC_PAYLOAD_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

namespace ckpt::ipc::internal {

uint64_t PayloadXxh3(const void* data, size_t size);

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_PAYLOAD_CHECKSUM_H_
