// ControlTarget: what the control API can ask of a running scheduler
// (private to ckpt::scheduler; implemented by SchedulerImpl).
//
// Thread-safety: every method runs on the scheduler's event loop thread, the
// thread of io(); the control server calls them from its handlers there.
#ifndef CKPT_SCHEDULER_CONTROL_TARGET_H_
#define CKPT_SCHEDULER_CONTROL_TARGET_H_

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"
#include "ckpt/scheduler/scheduler.h"

namespace ckpt::scheduler {

class ControlTarget {
 public:
  virtual ~ControlTarget() = default;
  virtual boost::asio::io_context& io() = 0;

  // Submits a parsed configuration (PrepareSubmission's, submit_checks.h),
  // recording `submitter` (the peer's uid) with a new experiment. Returns the
  // experiment id; Unavailable while the scheduler stops; Submit's errors.
  virtual StatusOr<std::string> SubmitConfig(const records::ExperimentConfig& config,
                                             std::optional<uint32_t> submitter) = 0;
  // The uid that submitted `exp` (unset: none recorded); NotFound naming it.
  virtual StatusOr<std::optional<uint32_t>> Submitter(const std::string& exp) = 0;
  virtual std::vector<ExperimentSummary> ListExperiments() = 0;
  // NotFound naming the experiment.
  virtual StatusOr<ExperimentSummary> ExperimentStatus(const std::string& exp) = 0;
  virtual std::vector<WorkerStatus> DeviceStatus() = 0;
  // The store directory.
  virtual std::string StorePath() = 0;
  // No new intervals start; in-flight ones finish and are committed.
  // NotFound; FailedPrecondition when the experiment has ended.
  virtual Status Pause(const std::string& exp) = 0;
  virtual Status Resume(const std::string& exp) = 0;
  // Ends the experiment now (status "stopped"); in-flight intervals finish.
  virtual Status Stop(const std::string& exp) = 0;
  // Makes a past version the member's head (store Restore); it takes effect
  // at the member's next interval (an interval in flight is discarded when it
  // comes back). Returns the new version.
  virtual StatusOr<int64_t> Restore(const std::string& exp, const std::string& member,
                                    int64_t version) = 0;
  virtual Status Pin(const std::string& exp, const std::string& member, int64_t version) = 0;
  virtual Status Unpin(const std::string& exp, const std::string& member, int64_t version) = 0;
  // Begins a graceful stop of the whole scheduler.
  virtual void Shutdown(const std::string& why) = 0;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_CONTROL_TARGET_H_
