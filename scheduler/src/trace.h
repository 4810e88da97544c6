// The scheduler's structured trace, for test harnesses (tests/chaos): with
// CKPT_TRACE_FILE=PATH in its environment, the scheduler appends one JSON
// object a line to PATH at each moment below, each line with one write(2) on
// an O_APPEND descriptor, after the fact it reports and before the scheduler
// goes on: a line written is in the file even when the scheduler is killed
// right after it (SIGKILL; a power loss is another matter). Without the
// variable nothing is opened and each call is one branch.
//
// Every line has "ev" (one of the names below), "pid" (the scheduler's) and
// "unix_ms"; then:
//   result     "worker", "task": a RESULT read from worker `worker`'s ring
//   committed  "exp", "member", "version", "interval", "blob" (hex id): a
//              trained result committed, i.e. acknowledged
//   exploited  "exp", "member", "donor", "version": an exploit committed
//   hello      "worker", "device": the device a worker says it trains on
//   lost       "worker", "reason": a worker declared dead or hung
//   store_full      a commit or exploit refused for want of space; dispatch pauses
//   store_writable  the store accepts writes again; dispatch resumes
// Std-only on purpose: harnesses include it for the names.
#ifndef CKPT_SCHEDULER_SRC_TRACE_H_
#define CKPT_SCHEDULER_SRC_TRACE_H_

#include <cstdint>
#include <string>

namespace ckpt::scheduler::trace {

inline constexpr const char* kEnv = "CKPT_TRACE_FILE";
inline constexpr const char* kResult = "result";
inline constexpr const char* kCommitted = "committed";
inline constexpr const char* kExploited = "exploited";
inline constexpr const char* kHello = "hello";
inline constexpr const char* kLost = "lost";
inline constexpr const char* kStoreFull = "store_full";
inline constexpr const char* kStoreWritable = "store_writable";

// Whether CKPT_TRACE_FILE names a file that could be opened (read once).
bool Enabled();

void Result(int worker, uint64_t task);
void Committed(const std::string& exp, const std::string& member, int64_t version, int interval,
               const std::string& blob_hex);
void Exploited(const std::string& exp, const std::string& member, const std::string& donor,
               int64_t version);
void Hello(int worker, const std::string& device);
void Lost(int worker, const std::string& reason);
void StoreFull();
void StoreWritable();

}  // namespace ckpt::scheduler::trace

#endif  // CKPT_SCHEDULER_SRC_TRACE_H_
