// ContentId: the blob id of ckpt::BlobId::Of (XXH3-128, seed 0), computed
// through libxxhash's runtime CPU dispatch (AVX2/AVX-512 where the CPU has
// them, about three times the SSE2 speed of the portable inline build). Same
// value by definition of XXH3; store tests check it against BlobId::Of.
//
// Thread-safety: pure function.
#ifndef CKPT_STORE_SRC_CONTENT_ID_H_
#define CKPT_STORE_SRC_CONTENT_ID_H_

#include <cstddef>

#include "ckpt/format/checksum.h"

namespace ckpt::store {

BlobId ContentId(const void* data, size_t size);

}  // namespace ckpt::store

#endif  // CKPT_STORE_SRC_CONTENT_ID_H_
