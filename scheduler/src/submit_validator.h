// SubmitValidator: runs PrepareSubmission (submit_checks.h: the path rules,
// the model's hash, the data file mapped and validated whole) off the event
// loop, so that the control socket keeps answering (status, list, other
// clients) while a large file is read, and bounds how long a submitter waits
// (private to ckpt::scheduler).
//
// Each submission gets its own thread. Its result comes back to the event
// loop; when the time bound passes first, the caller is answered with an
// error naming the bound and the late result is dropped. The work itself is
// not interrupted: a validation that overran still counts against
// `max_running` until it ends, so a stream of slow files cannot pile up
// threads.
//
// Thread-safety: every method runs on the event loop thread of `io`, except
// the destructor, which may run anywhere after the loop stopped; the
// destructor joins every validation thread.
#ifndef CKPT_SCHEDULER_SUBMIT_VALIDATOR_H_
#define CKPT_SCHEDULER_SUBMIT_VALIDATOR_H_

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"
#include "ckpt/scheduler/scheduler.h"

namespace ckpt::scheduler {

class SubmitValidator {
 public:
  using Done = std::function<void(StatusOr<records::ExperimentConfig>)>;

  // At most `max_running` validations at once. REQUIRES: max_running >= 1.
  SubmitValidator(boost::asio::io_context& io, int max_running);
  ~SubmitValidator();
  SubmitValidator(const SubmitValidator&) = delete;
  SubmitValidator& operator=(const SubmitValidator&) = delete;

  // Starts validating `toml` against `options` (copied; its
  // before_validation seam runs first, on the thread). `done` runs once on
  // the event loop: with PrepareSubmission's result, or with
  // ResourceExhausted naming submit_validation_timeout_s when
  // `options.submit_validation_timeout` passes first. Returns Unavailable,
  // without calling `done`, when `max_running` validations run already.
  Status Start(const ControlOptions& options, std::string toml, std::string origin, Done done);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_SUBMIT_VALIDATOR_H_
