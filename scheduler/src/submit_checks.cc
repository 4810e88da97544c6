#include "submit_checks.h"

#include <utility>

#include "ckpt/records/allowed_paths.h"
#include "ckpt/records/config.h"

namespace ckpt::scheduler {

Status CheckSubmittedPaths(const ControlOptions& control, const std::string& toml,
                           const std::string& origin) {
  if (!control.allowed_model_dirs && !control.allowed_data_dirs) return Status::OK();
  // Parsing without file checks accepts whatever the full parse accepts.
  CKPT_ASSIGN_OR_RETURN(records::ExperimentConfig config,
                        records::ParseExperimentConfig(toml, origin, records::FileChecks::kSkip));
  if (control.allowed_model_dirs) {
    CKPT_RETURN_IF_ERROR(
        records::CheckModelFileAllowed(config.model_spec, *control.allowed_model_dirs, origin));
  }
  if (control.allowed_data_dirs) {
    CKPT_RETURN_IF_ERROR(records::CheckDataPathAllowed(config, *control.allowed_data_dirs, origin));
  }
  return Status::OK();
}

StatusOr<records::ExperimentConfig> PrepareSubmission(const ControlOptions& control,
                                                      const std::string& toml,
                                                      const std::string& origin) {
  CKPT_RETURN_IF_ERROR(CheckSubmittedPaths(control, toml, origin));
  CKPT_ASSIGN_OR_RETURN(records::ExperimentConfig unchecked,
                        records::ParseExperimentConfig(toml, origin, records::FileChecks::kSkip));
  CKPT_ASSIGN_OR_RETURN(
      std::string sha256,
      records::ModelFileSha256(unchecked.model_spec, control.allowed_model_dirs, origin));
  CKPT_ASSIGN_OR_RETURN(records::ExperimentConfig config,
                        records::ParseExperimentConfig(toml, origin));
  config.model_sha256 = std::move(sha256);
  return config;
}

}  // namespace ckpt::scheduler
