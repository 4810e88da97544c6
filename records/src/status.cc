#include "ckpt/records/status.h"

#include <string>

namespace ckpt::records {

const char* ExperimentStatusName(ExperimentStatus status) {
  switch (status) {
    case ExperimentStatus::kRunning:
      return "running";
    case ExperimentStatus::kPaused:
      return "paused";
    case ExperimentStatus::kDone:
      return "done";
    case ExperimentStatus::kStopped:
      return "stopped";
    case ExperimentStatus::kFailed:
      return "failed";
  }
  return "running";
}

StatusOr<ExperimentStatus> ParseExperimentStatus(std::string_view name) {
  if (name == "created") return ExperimentStatus::kRunning;
  for (ExperimentStatus s :
       {ExperimentStatus::kRunning, ExperimentStatus::kPaused, ExperimentStatus::kDone,
        ExperimentStatus::kStopped, ExperimentStatus::kFailed}) {
    if (name == ExperimentStatusName(s)) return s;
  }
  return Status::InvalidArgument("unknown experiment status '" + std::string(name.substr(0, 32)) +
                                 "'");
}

const char* ExperimentPhaseName(ExperimentPhase phase) {
  switch (phase) {
    case ExperimentPhase::kTraining:
      return "training";
    case ExperimentPhase::kFinalEval:
      return "final eval";
    case ExperimentPhase::kDone:
      return "done";
  }
  return "training";
}

StatusOr<ExperimentPhase> ParseExperimentPhase(std::string_view name) {
  for (auto p : {ExperimentPhase::kTraining, ExperimentPhase::kFinalEval, ExperimentPhase::kDone}) {
    if (name == ExperimentPhaseName(p)) return p;
  }
  return Status::InvalidArgument("unknown experiment phase '" + std::string(name) +
                                 "' (known: training, final eval, done)");
}

const char* MemberStatusName(MemberStatus status) {
  switch (status) {
    case MemberStatus::kIdle:
      return "idle";
    case MemberStatus::kQueued:
      return "queued";
    case MemberStatus::kRunning:
      return "running";
    case MemberStatus::kDone:
      return "done";
    case MemberStatus::kStopped:
      return "stopped";
    case MemberStatus::kFailed:
      return "failed";
  }
  return "idle";
}

StatusOr<MemberStatus> ParseMemberStatus(std::string_view name) {
  for (int i = 0; i < kMemberStatusCount; ++i) {
    const auto s = static_cast<MemberStatus>(i);
    if (name == MemberStatusName(s)) return s;
  }
  return Status::InvalidArgument("unknown member status '" + std::string(name.substr(0, 32)) + "'");
}

}  // namespace ckpt::records
