// The scheduler's events in the structured trace (ckpt/logging/trace_file.h:
// CKPT_TRACE_FILE=PATH, one JSON object a line, one write each, a line
// written survives a SIGKILL right after it), for test harnesses
// (tests/chaos). Each is written after the fact it reports and before the
// scheduler goes on.
//
// Every line has "ev" (one of the names below), "pid" and "unix_ms"; then:
//   result     "worker", "task": a RESULT read from worker `worker`'s ring
//   committed  "exp", "member", "version", "interval", "blob" (hex id): a
//              trained result committed, i.e. acknowledged
//   exploited  "exp", "member", "donor", "version": an exploit committed
//   hello      "worker", "device": the device a worker says it trains on
//   lost       "worker", "reason": a worker declared dead or hung
//   bad_result "worker", "task", "member" (EXP/MEMBER): a RESULT refused as
//              not answering its task (result_check.h); nothing committed
//   store_full      a commit or exploit refused for want of space; dispatch pauses
//   store_writable  the store accepts writes again; dispatch resumes
//   ended      "exp", "status" (records::ExperimentStatusName): an experiment
//              ended (done, stopped or failed)
// Its local workers write to the same file (they inherit the variable): a
// worker about to kill itself at an armed kill point writes
// base::kill_points::kTraceEvent ("kill_point") with "point".
// Std-only on purpose: harnesses include it for the names.
#ifndef CKPT_SCHEDULER_SRC_TRACE_H_
#define CKPT_SCHEDULER_SRC_TRACE_H_

#include <cstdint>
#include <string>

namespace ckpt::scheduler::trace {

inline constexpr const char* kEnv = "CKPT_TRACE_FILE";  // logging::kTraceFileVariable
inline constexpr const char* kResult = "result";
inline constexpr const char* kCommitted = "committed";
inline constexpr const char* kExploited = "exploited";
inline constexpr const char* kHello = "hello";
inline constexpr const char* kLost = "lost";
inline constexpr const char* kBadResult = "bad_result";
inline constexpr const char* kStoreFull = "store_full";
inline constexpr const char* kStoreWritable = "store_writable";
inline constexpr const char* kEnded = "ended";

// Whether CKPT_TRACE_FILE names a file that could be opened (read once).
bool Enabled();

void Result(int worker, uint64_t task);
void Committed(const std::string& exp, const std::string& member, int64_t version, int interval,
               const std::string& blob_hex);
void Exploited(const std::string& exp, const std::string& member, const std::string& donor,
               int64_t version);
void Hello(int worker, const std::string& device);
void Lost(int worker, const std::string& reason);
void BadResult(int worker, uint64_t task, const std::string& member);
void StoreFull();
void StoreWritable();
void Ended(const std::string& exp, const std::string& status);

}  // namespace ckpt::scheduler::trace

#endif  // CKPT_SCHEDULER_SRC_TRACE_H_
