#include "futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace ckpt::ipc::internal {

void FutexWait(layout::SharedU32* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: re-check.
  syscall(SYS_futex, &word->raw, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(layout::SharedU32* word) {
  syscall(SYS_futex, &word->raw, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void FutexBumpAndWake(layout::SharedU32* word) {
  word->FetchAddRelease(1);
  FutexWakeAll(word);
}

}  // namespace ckpt::ipc::internal
