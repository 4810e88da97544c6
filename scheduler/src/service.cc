#include "ckpt/scheduler/service.h"

#include <systemd/sd-daemon.h>

#include <cstring>
#include <string>

#include "log.h"

namespace ckpt::scheduler {
namespace {

void LogLine(FILE* log, const std::string& line) {
  if (log == nullptr) return;
  Logger().info("{}", line);
}

}  // namespace

ControlOptions ControlOptionsFor(const ServiceConfig& c) {
  ControlOptions o;
  o.socket_path = c.socket;
  o.allowed_users = c.allowed_users;
  o.allowed_groups = c.allowed_groups;
  o.admins = c.admins;
  o.max_request_bytes = c.max_request_bytes;
  o.max_clients = c.max_clients;
  o.client_idle_timeout = c.client_idle_timeout;
  o.submit_validation_timeout = c.submit_validation_timeout;
  o.allowed_model_dirs = c.allowed_model_dirs;
  o.allowed_data_dirs = c.allowed_data_dirs;
  return o;
}

SchedulerOptions SchedulerOptionsFor(const ServiceConfig& c) {
  SchedulerOptions o;
  o.store_path = c.store;
  o.devices = c.devices;
  o.worker_binary = c.worker_binary;
  o.ring_bytes = c.ring_bytes;
  o.supervision = c.supervision;
  o.remote = c.remote;
  o.metrics = c.metrics;
  o.metrics_required = true;
  o.final_eval_top = c.final_eval_top;
  o.progress = c.log_progress ? stdout : nullptr;
  o.sync_interval_commits = c.sync_interval_commits;
  o.blob_log = c.blob_log;
  o.serve = true;
  o.control = ControlOptionsFor(c);
  return o;
}

Status RunService(const std::string& config_path, const ServiceRunOptions& run_options) {
  CKPT_ASSIGN_OR_RETURN(ServiceConfig config, LoadServiceConfig(config_path));
  SchedulerOptions options = SchedulerOptionsFor(config);
  CKPT_ASSIGN_OR_RETURN(options.kill_point, KillPointFromEnvironment());
  FILE* log = run_options.log;
  // Reloads compare against the configuration the service started with:
  // what needs a restart keeps being reported until it happens.
  options.reload = [config_path, config, log]() -> StatusOr<ControlOptions> {
    CKPT_ASSIGN_OR_RETURN(ServiceConfig next, LoadServiceConfig(config_path));
    const std::string restart = SettingsNeedingRestart(config, next);
    if (!restart.empty()) {
      LogLine(log, "SIGHUP: " + config_path + " changes " + restart +
                       ", which only a restart applies; the running values stay");
    }
    return ControlOptionsFor(next);
  };
  if (run_options.notify_systemd) {
    options.notify = [log](const std::string& state) {
      const int rc = sd_notify(0, state.c_str());
      if (rc < 0) LogLine(log, "sd_notify(" + state + "): " + std::strerror(-rc));
    };
  }
  auto scheduler = Scheduler::Create(options);
  if (!scheduler.ok()) {
    if (scheduler.status().IsUnavailable()) {
      return Status::Unavailable("another ckpt-scheduler holds the store (" +
                                 scheduler.status().message() + "); not starting");
    }
    return scheduler.status();
  }
  LogLine(log,
          fmt::format("starting: store {}, control socket {}, grace {:.1f} s", config.store,
                      config.socket, static_cast<double>(config.supervision.grace.count()) / 1000));
  Status run = (*scheduler)->Run();
  scheduler->reset();  // closes the store
  if (!run.ok()) return run;
  LogLine(log, "stopped gracefully; store " + config.store + " closed");
  return Status::OK();
}

}  // namespace ckpt::scheduler
