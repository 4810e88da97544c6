// Futex waits on 32-bit words in shared memory (Linux). A wait sleeps only
// while the word still holds `expected`, and never longer than `timeout`:
// callers loop and re-check, so spurious returns are harmless.
//
// Thread-safety: any thread; the words are shared between processes, so the
// non-private futex operations are used.
#ifndef CKPT_IPC_SRC_FUTEX_H_
#define CKPT_IPC_SRC_FUTEX_H_

#include <chrono>
#include <cstdint>

#include "layout.h"

namespace ckpt::ipc::internal {

// Sleeps until `word` is woken, no longer holds `expected`, or `timeout` passed.
void FutexWait(layout::SharedU32* word, uint32_t expected, std::chrono::nanoseconds timeout);
// Wakes every thread, of any process, sleeping on `word`.
void FutexWakeAll(layout::SharedU32* word);
// Bumps `word` (release) and wakes its sleepers: a sleeper that read the old
// value before this call returns at once instead of sleeping.
void FutexBumpAndWake(layout::SharedU32* word);

// A short pause for spin loops.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_FUTEX_H_
