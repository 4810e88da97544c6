// The scheduler's one logger (spdlog), used by every unit of ckpt::scheduler
// (private). Lines go to stderr: coloured with a time stamp on a terminal,
// plain "LEVEL: message" lines when stderr is not one (journald, a log file,
// a test capturing output), since journald stamps lines itself.
//
// Level: info by default; CKPT_TRACE=1 makes it trace (one line per record
// sent and received); CKPT_LOG_LEVEL=trace|debug|info|warn|error|off sets it.
//
// Thread-safety: the logger is created once (thread-safe static) and spdlog's
// _mt sinks serialize lines; call it from any thread.
#ifndef CKPT_SCHEDULER_LOG_H_
#define CKPT_SCHEDULER_LOG_H_

#include <spdlog/spdlog.h>

#include <cstdint>

namespace ckpt::scheduler {

spdlog::logger& Logger();

// Exceptions caught at a thread or process root (none is expected: library
// calls return a Status). Each root logs what it caught and counts it here.
void CountRootException();
int64_t RootExceptionCount();

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_LOG_H_
