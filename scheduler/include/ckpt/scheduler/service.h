// The `ckpt-scheduler serve` service: its run. The configuration file it reads
// is records::ServiceConfig (ckpt/records/service_config.h: every key, its
// default, and what allowed_model_dirs allows).
//
// SIGHUP re-reads the file: allowed users and groups, admins,
// allowed_model_dirs, allowed_data_dirs and the [control] limits apply at
// once (to later submissions and connections); a change to anything else is
// reported (restart to apply).
//
// Thread-safety: ServiceConfig is a value; RunService runs on the calling thread.
#ifndef CKPT_SCHEDULER_SERVICE_H_
#define CKPT_SCHEDULER_SERVICE_H_

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"
#include "ckpt/records/service_config.h"
#include "ckpt/scheduler/scheduler.h"

namespace ckpt::scheduler {

using records::LoadServiceConfig;
using records::ParseServiceConfig;
using records::ServiceConfig;

// The scheduler and control-socket options a configuration stands for
// (SchedulerOptions::reload and ::notify are left empty).
SchedulerOptions SchedulerOptionsFor(const ServiceConfig& config);
ControlOptions ControlOptionsFor(const ServiceConfig& config);

struct ServiceRunOptions {
  // The service's own lines (start, reloads, the reason it stopped) go to the
  // scheduler's logger (stderr; plain lines under journald); nullptr silences
  // them. Default: stderr.
  FILE* log = stderr;
  // Tell systemd (sd_notify) READY=1 / STOPPING=1; a no-op when $NOTIFY_SOCKET
  // is unset. Default: true.
  bool notify_systemd = true;
};

// Loads the configuration at `config_path` and serves until SIGTERM/SIGINT or
// a shutdown request: every unfinished experiment of the store resumes, the
// control socket answers, SIGHUP reloads the file. Returns OK after a graceful
// stop; InvalidArgument for a bad configuration; Unavailable naming the store
// when another scheduler holds it; AlreadyExists when another scheduler serves
// the socket; the scheduler's error otherwise.
Status RunService(const std::string& config_path, const ServiceRunOptions& run_options = {});

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_SERVICE_H_
