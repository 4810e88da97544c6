#include "content_id.h"

#include <xxh_x86dispatch.h>

namespace ckpt::store {

BlobId ContentId(const void* data, size_t size) {
  XXH128_hash_t h = XXH3_128bits_dispatch(data, size);
  return BlobId{h.high64, h.low64};
}

}  // namespace ckpt::store
