// Process-wide allocator settings for a training process (glibc malloc).
//
// A LeNet-5 training step allocates and frees activations and gradients of
// 0.1-2 MB every step. With glibc's defaults, blocks that large are mmap'd and
// munmap'd (or the top of the heap is trimmed back to the kernel) on every
// free, so each step faults its buffers in again and the kernel zeroes every
// page: in `ckpt-bench train` that was 14% of the CPU in system time and
// plain training ran 1.4-1.5x slower than with the settings below.
//
// TuneAllocatorForTraining keeps blocks up to 32 MiB in the heap
// (M_MMAP_THRESHOLD) and returns free memory at the top of a heap to the
// kernel only past 64 MiB (M_TRIM_THRESHOLD). Cost: up to that much freed
// memory stays resident per arena after a peak (peak RSS itself barely
// moves: +15 MB in `ckpt-bench train`).
//
// An explicit setting in the environment wins (MALLOC_MMAP_THRESHOLD_,
// MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES): those are left alone.
// Call once at process start, before threads allocate. Not thread-safe.
#ifndef CKPT_WORKER_ALLOCATOR_H_
#define CKPT_WORKER_ALLOCATOR_H_

#include <cstddef>

namespace ckpt::worker {

inline constexpr size_t kTrainingMmapThresholdBytes = size_t{32} << 20;
inline constexpr size_t kTrainingTrimThresholdBytes = size_t{64} << 20;

// Returns false when the environment already configures malloc (nothing done)
// or glibc refused a setting.
bool TuneAllocatorForTraining();

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_ALLOCATOR_H_
