// Process figures read from /proc: CPU seconds and resident memory of a process.
//
// std-only and stateless; safe to call from any thread. A sampled process is
// identified by its pid and its start time (field 22 of /proc/PID/stat, in
// clock ticks since boot), so that a pid reused by an unrelated process after
// the worker died is never reported as the worker.
#ifndef CKPT_METRICS_SRC_PROCESS_SAMPLER_H_
#define CKPT_METRICS_SRC_PROCESS_SAMPLER_H_

#include <sys/types.h>

#include <cstdint>

#include "ckpt/base/status.h"

namespace ckpt::metrics {

struct ProcessSample {
  double cpu_seconds = 0;  // user + system, all threads, since the process started
  int64_t resident_bytes = 0;
  uint64_t start_ticks = 0;  // field 22 of /proc/PID/stat
};

// Reads /proc/PID/stat. NotFound when there is no such process or it is a
// zombie; Corruption (naming the file) when the file cannot be parsed.
// REQUIRES: pid > 0.
StatusOr<ProcessSample> SampleProcess(pid_t pid);

// As SampleProcess, but NotFound as well when the process's start time is not
// `start_ticks` (the pid now belongs to another process).
StatusOr<ProcessSample> SampleProcessStartedAt(pid_t pid, uint64_t start_ticks);

// CPUs this process may run on (sched_getaffinity), at least 1.
int HostCpus();

}  // namespace ckpt::metrics

#endif  // CKPT_METRICS_SRC_PROCESS_SAMPLER_H_
