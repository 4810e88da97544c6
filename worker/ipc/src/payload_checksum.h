// XXH3-64 of record payloads: the same value as ckpt::Xxh3_64, computed with
// AVX2 when the CPU has it. Payload checksums are two of the passes over every
// byte a record costs (producer and consumer), so their speed is the ring's;
// CopyAndXxh3 folds a checksum into the copy that moves the bytes anyway.
//
// Thread-safety: pure function.
#ifndef CKPT_IPC_SRC_PAYLOAD_CHECKSUM_H_
#define CKPT_IPC_SRC_PAYLOAD_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "ckpt/ipc/channel.h"

namespace ckpt::ipc::internal {

uint64_t PayloadXxh3(const void* data, size_t size);

// Copies `size` bytes from `src` to `dst` and returns PayloadXxh3 of the bytes
// written to `dst`, in one pass: each chunk is hashed while it is still in
// the L1 cache from its copy, instead of a second read of a buffer larger
// than the caches. What is hashed is the destination, so a writer to `src`
// (the ring, for a receiver) cannot change what the checksum covers.
// REQUIRES: the ranges do not overlap.
uint64_t CopyAndXxh3(void* dst, const void* src, size_t size);

// CopyAndXxh3 of bytes [offset, offset + size) of the concatenation of
// `parts` (count of them): a payload sent in pieces, or a fragment of it.
// REQUIRES: the parts hold offset + size bytes; no part overlaps dst.
uint64_t GatherAndXxh3(void* dst, const PayloadPart* parts, size_t count, uint64_t offset,
                       size_t size);

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_PAYLOAD_CHECKSUM_H_
