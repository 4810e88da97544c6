#include "ckpt/worker/allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <initializer_list>

namespace ckpt::worker {

bool TuneAllocatorForTraining() {
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(v) != nullptr) return false;
  }
  const bool mmap_ok =
      mallopt(M_MMAP_THRESHOLD, static_cast<int>(kTrainingMmapThresholdBytes)) == 1;
  const bool trim_ok =
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrainingTrimThresholdBytes)) == 1;
  return mmap_ok && trim_ok;
}

}  // namespace ckpt::worker
