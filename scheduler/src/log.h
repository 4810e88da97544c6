// The scheduler's logger is the process's one logger (ckpt/logging/logging.h:
// stderr, plain lines off a terminal, CKPT_TRACE / CKPT_LOG_LEVEL), used by
// every unit of ckpt::scheduler (private).
//
// Thread-safety: as ckpt::logging::Logger; the counters are atomic.
#ifndef CKPT_SCHEDULER_LOG_H_
#define CKPT_SCHEDULER_LOG_H_

#include <cstdint>

#include "ckpt/logging/logging.h"

namespace ckpt::scheduler {

using logging::Logger;

// Exceptions caught at a thread or process root (none is expected: library
// calls return a Status). Each root logs what it caught and counts it here.
void CountRootException();
int64_t RootExceptionCount();

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_LOG_H_
