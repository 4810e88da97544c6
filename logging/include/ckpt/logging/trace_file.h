// The structured trace, for test harnesses (tests/chaos): with
// CKPT_TRACE_FILE=PATH in its environment, a ckpt process (the scheduler, and
// its local workers, which inherit the variable) appends one JSON object a
// line to PATH, each line with one write(2) on an O_APPEND descriptor, so
// that lines from several threads and processes stay whole and a line
// written is in the file even when the process is killed right after it
// (SIGKILL; a power loss is another matter). Without the variable nothing is
// opened and each call is one branch.
//
// Every line has "ev", "pid" (the writer's) and "unix_ms", then the event's
// fields. The scheduler's events are named in scheduler/src/trace.h; a
// process about to kill itself at an armed kill point writes
// base::kill_points::kTraceEvent with "point".
//
// Thread-safety: any thread; the descriptor is opened once (thread-safe
// static).
#ifndef CKPT_LOGGING_TRACE_FILE_H_
#define CKPT_LOGGING_TRACE_FILE_H_

#include <nlohmann/json.hpp>

namespace ckpt::logging {

inline constexpr char kTraceFileVariable[] = "CKPT_TRACE_FILE";

// Whether CKPT_TRACE_FILE names a file that could be opened (read once; a
// file that cannot be opened is said once in the log).
bool TraceEnabled();

// Appends `fields` (a JSON object) with "ev" = `ev`, "pid" and "unix_ms".
// Nothing when !TraceEnabled().
void EmitTrace(const char* ev, nlohmann::json fields);

}  // namespace ckpt::logging

#endif  // CKPT_LOGGING_TRACE_FILE_H_
