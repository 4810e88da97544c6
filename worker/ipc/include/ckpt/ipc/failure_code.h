// FailureCode: why a member-interval failed, with one spelling per reason.
// The worker sends it in FAILED records (ipc::Failed::code), the scheduler
// keeps it in "failed" events and counts it in ckpt_member_failures_total
// {reason}.
//
// Spelling: FailureCodeName ("non_finite", ...). ParseFailureCode also reads
// what earlier versions wrote: the worker's hyphenated codes ("non-finite",
// "out-of-memory", "bad-state", "bad-request", "configure-refused") and, for a
// refused commit, the name of its Status code ("Aborted", "IOError", ...: kCommitError), so old
// event logs and old workers still read.
//
// Thread-safety: pure functions.
#ifndef CKPT_IPC_FAILURE_CODE_H_
#define CKPT_IPC_FAILURE_CODE_H_

#include <optional>
#include <string_view>

namespace ckpt::ipc {

enum class FailureCode {
  kNonFinite,    // "non_finite": the loss or a parameter became NaN or infinite
  kOutOfMemory,  // "out_of_memory"
  kBadState,     // "bad_state": the worker rejected the member's checkpoint
  kBadRequest,   // "bad_request": the worker rejected the TRAIN record
  kInternal,     // "internal": any other worker-side failure
  kCommitError,  // "commit_error": the store refused the result
  kWorkerLost,   // "worker_lost": the worker died or hung with the member in flight
  kStoreFull,    // "store_full": the store's disk was full; the interval is rerun
                 // once it has space, and it does not count against the member
  kBadResult,    // "bad_result": the worker's RESULT did not answer its task (a score
                 // out of range, another step, sample count or state layout: the
                 // scheduler's result_check.h); nothing is committed, the interval is
                 // rerun, and it does not count against the member (the worker's fault)
  // The codes above are the member failures ckpt_member_failures_total counts
  // (the first kMemberFailureCodeCount); the two below are not a member's.
  kAborted,           // "aborted": the worker abandoned the interval (it was told to stop)
  kConfigureRefused,  // "configure_refused": the worker could not set the experiment up
};
inline constexpr int kMemberFailureCodeCount = 9;
inline constexpr int kFailureCodeCount = 11;

const char* FailureCodeName(FailureCode code);

// The code named by `name` (see the file comment for the spellings read);
// nullopt for anything else.
std::optional<FailureCode> ParseFailureCode(std::string_view name);

// A FAILED record's code from a worker: ParseFailureCode, kInternal for a
// code this version does not know (a newer worker's).
FailureCode FailureCodeFromWorker(std::string_view name);

}  // namespace ckpt::ipc

#endif  // CKPT_IPC_FAILURE_CODE_H_
