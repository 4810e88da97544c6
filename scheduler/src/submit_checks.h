// What the service does with a submitted (or resumed) experiment's text
// before the event loop takes it (private to ckpt::scheduler): the rules of
// ControlOptions on the files it names (allowed_model_dirs, allowed_data_dirs:
// records::CheckModelFileAllowed, CheckDataPathAllowed) judged before any of
// them is opened, the TorchScript file pinned by its SHA-256, and the full
// parse that opens and validates the data.
//
// Thread-safety: reentrant; it reads the file system only, so the control
// server runs it off the event loop.
#ifndef CKPT_SCHEDULER_SUBMIT_CHECKS_H_
#define CKPT_SCHEDULER_SUBMIT_CHECKS_H_

#include <string>

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"
#include "ckpt/scheduler/scheduler.h"

namespace ckpt::scheduler {

// OK when `control` sets no rule or the experiment passes each that it sets;
// the parse error (key and line) or the rule's InvalidArgument otherwise.
Status CheckSubmittedPaths(const ControlOptions& control, const std::string& toml,
                           const std::string& origin);

// CheckSubmittedPaths, then model_sha256 (records::ModelFileSha256, beneath
// the allowed directory when allowed_model_dirs is set), then
// ParseExperimentConfig with its file checks. Returns the configuration to
// submit; the first error otherwise.
StatusOr<records::ExperimentConfig> PrepareSubmission(const ControlOptions& control,
                                                      const std::string& toml,
                                                      const std::string& origin);

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_SUBMIT_CHECKS_H_
