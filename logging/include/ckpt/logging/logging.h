// The one spdlog logger configuration of every ckpt process: the scheduler
// (and the metrics library inside it), the worker and the tool.
//
// Lines go to stderr: coloured with a time stamp on a terminal, plain
// "LEVEL: message" lines when stderr is not one (journald, a log file, the
// scheduler's log that its local workers share, a test capturing output),
// since journald stamps lines itself. Every line is flushed as it is written,
// so a line logged just before a process dies (a kill point, an abort) is not
// lost.
//
// Level: info by default; CKPT_TRACE=1 makes it trace (one line per record
// sent and received); CKPT_LOG_LEVEL=trace|debug|info|warn|error|off sets it.
//
// Thread-safety: the logger is created once (thread-safe static) and spdlog's
// _mt sinks serialize lines; call it from any thread.
#ifndef CKPT_LOGGING_LOGGING_H_
#define CKPT_LOGGING_LOGGING_H_

#include <spdlog/spdlog.h>

namespace ckpt::logging {

// The process's logger, configured as above on first use.
spdlog::logger& Logger();

}  // namespace ckpt::logging

#endif  // CKPT_LOGGING_LOGGING_H_
