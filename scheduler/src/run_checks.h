// The checks `ckpt-scheduler run` makes before it creates anything (the
// store, its directory, a worker), in one place: `run` calls CheckRun and then
// creates; `check` calls CheckRun and stops. Both print the same error for the
// same input.
//
// Thread-safety: functions of their arguments and the environment.
#ifndef CKPT_SCHEDULER_RUN_CHECKS_H_
#define CKPT_SCHEDULER_RUN_CHECKS_H_

#include <string>

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"
#include "ckpt/scheduler/scheduler.h"

namespace ckpt::scheduler {

// `run`'s command line (`check` takes the part of it that is checked).
struct RunFlags {
  std::string path;
  std::string store;   // "" = the file's
  std::string worker;  // "" = next to this program
  bool quiet = false;
  int backoff_ms = -1;  // -1 = the file's
  int grace_ms = -1;
  int ring_mib = static_cast<int>(records::kDefaultRingBytes >> 20);
  std::string listen;       // "" = the file's [workers] listen
  std::string secret_file;  // "" = the file's
  bool no_local_workers = false;
  bool blob_log = true;      // StoreOptions::blob_log
  std::string summary_json;  // "" = none; else the final summary's JSON goes there
};

// An experiment file that passed every check, and the options to run it with.
struct CheckedRun {
  records::ExperimentConfig config;
  SchedulerOptions options;
};

// Parses and checks the experiment file (TOML, tensor file, model file: see
// records::LoadExperimentConfig), $CKPT_KILL_AT, the worker options, the
// ckpt-worker binary (when local workers run) and the store path (not an
// existing non-directory); reads files, creates none. Every error is one the
// user fixes in the command or a file (`run` and `check` exit 2 on it):
// InvalidArgument naming the key and its line, the tensor or the flag;
// NotFound naming the missing file; IOError for an unreadable experiment file.
StatusOr<CheckedRun> CheckRun(const RunFlags& flags);

// `check`'s line for a file that passed:
// "ok: <name>: <members> members, <model>, <dataset>".
std::string CheckedLine(const records::ExperimentConfig& config);

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_RUN_CHECKS_H_
