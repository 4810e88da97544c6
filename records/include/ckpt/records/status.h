// The status enums of what the scheduler stores and reports: an experiment's
// status (the store's experiment record, the control API, ckpt-tool), its
// phase (summaries, the control API) and a member's status (the member
// record, metrics, summaries), each with its one spelling.
//
// Thread-safety: pure functions.
#ifndef CKPT_RECORDS_STATUS_H_
#define CKPT_RECORDS_STATUS_H_

#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt::records {

// An experiment's status as the store keeps it.
enum class ExperimentStatus { kRunning, kPaused, kDone, kStopped, kFailed };
// "running", "paused", "done", "stopped", "failed".
const char* ExperimentStatusName(ExperimentStatus status);
// The names above; the store's initial "created" reads as kRunning.
// InvalidArgument quoting any other name.
StatusOr<ExperimentStatus> ParseExperimentStatus(std::string_view name);

// Where an experiment is in its run: training its intervals, evaluating its
// best members on the test split, or ended (done, stopped or failed). Not
// stored: summaries and the control API report it.
enum class ExperimentPhase { kTraining, kFinalEval, kDone };
// "training", "final eval", "done".
const char* ExperimentPhaseName(ExperimentPhase phase);
// The names above. InvalidArgument quoting any other name.
StatusOr<ExperimentPhase> ParseExperimentPhase(std::string_view name);

// What a member is doing. The first three are the event loop's; the member
// record keeps kIdle, kQueued and kRunning as one stored value ("running").
enum class MemberStatus { kIdle, kQueued, kRunning, kDone, kStopped, kFailed };
inline constexpr int kMemberStatusCount = 6;
// "idle", "queued", "running", "done", "stopped", "failed".
const char* MemberStatusName(MemberStatus status);
// The names above. InvalidArgument quoting any other name.
StatusOr<MemberStatus> ParseMemberStatus(std::string_view name);
// The status as the member record stores it and summaries report it: kIdle
// and kQueued read as kRunning (the member is still part of the run).
inline MemberStatus StoredMemberStatus(MemberStatus status) {
  return status == MemberStatus::kIdle || status == MemberStatus::kQueued ? MemberStatus::kRunning
                                                                          : status;
}
// True for kDone, kStopped and kFailed: the member trains no more.
inline bool Finished(MemberStatus status) {
  return status == MemberStatus::kDone || status == MemberStatus::kStopped ||
         status == MemberStatus::kFailed;
}

}  // namespace ckpt::records

#endif  // CKPT_RECORDS_STATUS_H_
