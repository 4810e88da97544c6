// Process-wide allocator settings for a training process (glibc malloc or
// jemalloc).
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
//
// Under jemalloc (ckpt links glibc's malloc, but an operator may LD_PRELOAD
// jemalloc, as is common for RocksDB services) the same trap has another
// form: jemalloc hands freed pages back to the kernel over the following
// seconds (its "decay"), so an evaluation's buffers, idle between intervals,
// were returned and faulted in again, and the seed workload's evaluation took
// 2.1-2.4x its thread-seconds under glibc's tuned malloc (bench/RESULTS.md).
// TuneAllocatorForTraining turns jemalloc's decay off (dirty_decay_ms and
// muzzy_decay_ms -1, for every arena, those made later included): freed
// memory stays with the process, as with the glibc settings above. A
// MALLOC_CONF in the environment that sets either decay wins.
#ifndef CKPT_WORKER_ALLOCATOR_H_
#define CKPT_WORKER_ALLOCATOR_H_

#include <cstddef>
#include <string>

namespace ckpt::worker {

inline constexpr size_t kTrainingMmapThresholdBytes = size_t{32} << 20;
inline constexpr size_t kTrainingTrimThresholdBytes = size_t{64} << 20;

// Returns false when the environment already configures the process's malloc
// (nothing done) or the malloc refused a setting.
bool TuneAllocatorForTraining();

// The malloc this process runs, for logs and benchmark records: "jemalloc "
// and its version where jemalloc replaced glibc's (LD_PRELOAD or linked),
// else "glibc " and glibc's version (also under a sanitizer, whose allocator
// it does not tell apart). Thread-safe.
std::string MallocName();

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_ALLOCATOR_H_
