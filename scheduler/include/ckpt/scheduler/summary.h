// What the scheduler reports of its experiments and workers: the values of
// the control API (`status`, `list`, `devices`), of `ckpt-scheduler run`'s
// summary table and of `ckpt-tool`. Plain values, std and ckpt::records only,
// so that the control client and the tool need nothing of the scheduler's
// engine.
//
// Thread-safety: values.
#ifndef CKPT_SCHEDULER_SUMMARY_H_
#define CKPT_SCHEDULER_SUMMARY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/format/task.h"
#include "ckpt/ipc/fusion_mode.h"
#include "ckpt/records/status.h"

namespace ckpt::scheduler {

// One member's line in an experiment's summary.
struct MemberSummary {
  std::string member;
  int intervals_done = 0;
  // As the member record stores it: kRunning (idle, queued or training),
  // kDone, kStopped or kFailed (records::StoredMemberStatus).
  records::MemberStatus status = records::MemberStatus::kRunning;
  // The experiment's metric (ExperimentSummary::metric) on validation and
  // test; format::kNotEvaluated (NaN) until measured.
  double val_score = format::kNotEvaluated;
  double test_score = format::kNotEvaluated;
  int64_t version = 0;
  int64_t step = 0;
  std::map<std::string, double> hparams;
};

// One worker process as the scheduler sees it.
struct WorkerStatus {
  int index = 0;
  std::string device;
  std::string host;    // "" = the scheduler's host; "ADDRESS:PORT" of a remote worker
  int64_t pid = 0;     // 0 while not running
  bool ready = false;  // said HELLO
  // kPlain or kFused once its first CONFIGURE chose; none before.
  std::optional<ipc::FusionMode> mode;
  int capacity = 0;
  int busy = 0;
  int restarts = 0;
  bool given_up = false;
  double samples_per_s = 0;  // last STATS
  // Last STATS: the worker process's resident memory, and what its device
  // allocator holds (the CUDA caching allocator on a GPU; 0 on a CPU).
  int64_t rss_bytes = 0;
  int64_t device_memory_bytes = 0;
  // Its GPU as NVML sees it now (the whole device, every process on it):
  // only for a local worker on "cuda:K" when the scheduler reads NVML.
  std::optional<double> gpu_utilization;  // 0..1
  std::optional<int64_t> gpu_memory_used_bytes;
  std::optional<int64_t> gpu_memory_total_bytes;
};

struct ExperimentSummary {
  std::string id;
  records::ExperimentStatus status = records::ExperimentStatus::kRunning;
  records::ExperimentPhase phase = records::ExperimentPhase::kTraining;
  // What every score is (shown as "val_accuracy", "test_r2", ...).
  format::MetricKind metric = format::MetricKind::kAccuracy;
  int population = 0;
  int intervals = 0;
  int generation = 0;  // min intervals done over active members
  int64_t exploits = 0;
  int64_t train_samples = 0;     // this run
  int64_t member_intervals = 0;  // intervals committed by this run
  double wall_s = 0;             // this run, from Submit
  double training_s = 0;         // this run, from the first dispatch to the last result
  // This run, from the first dispatch to the first committed result: worker
  // start-up (CONFIGURE loads the dataset) and one member's interval.
  double first_result_s = 0;
  std::vector<MemberSummary> members;  // best first
  std::string store_path;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_SUMMARY_H_
