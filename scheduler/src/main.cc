// ckpt-scheduler: runs population-based training experiments.
//
//   ckpt-scheduler run EXPERIMENT.toml [--store DIR] [--quiet]
//   ckpt-scheduler serve --config /etc/ckpt/scheduler.toml
//
// Thin: parses flags, fills SchedulerOptions, calls the library.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <utility>

#include "ckpt/scheduler/config.h"
#include "ckpt/scheduler/scheduler.h"
#include "ckpt/scheduler/service.h"

namespace {

int Run(const std::string& path, const std::string& store_override, const std::string& worker,
        bool quiet, int backoff_ms, int grace_ms) {
  auto config = ckpt::scheduler::LoadExperimentConfig(path);
  if (!config.ok()) {
    std::fprintf(stderr, "ckpt-scheduler: %s\n", config.status().ToString().c_str());
    return 2;
  }
  ckpt::scheduler::SchedulerOptions options;
  options.store_path = store_override.empty() ? config->store : store_override;
  options.devices = config->devices;
  options.supervision = config->supervision;
  options.metrics = config->metrics;
  options.worker_binary = worker;
  options.progress = quiet ? nullptr : stdout;
  if (backoff_ms >= 0) options.supervision.restart_backoff = std::chrono::milliseconds(backoff_ms);
  if (grace_ms >= 0) options.supervision.grace = std::chrono::milliseconds(grace_ms);
  auto kill_point = ckpt::scheduler::KillPointFromEnvironment();
  if (!kill_point.ok()) {
    std::fprintf(stderr, "ckpt-scheduler: %s\n", kill_point.status().ToString().c_str());
    return 2;
  }
  options.kill_point = std::move(*kill_point);
  auto scheduler = ckpt::scheduler::Scheduler::Create(options);
  if (!scheduler.ok()) {
    std::fprintf(stderr, "ckpt-scheduler: %s\n", scheduler.status().ToString().c_str());
    return 1;
  }
  if (auto s = (*scheduler)->Submit(*config); !s.ok()) {
    std::fprintf(stderr, "ckpt-scheduler: %s\n", s.ToString().c_str());
    return 1;
  }
  ckpt::Status run = (*scheduler)->Run();
  auto summary = (*scheduler)->Summary(config->name);
  if (summary.ok()) ckpt::scheduler::PrintSummary(*summary, stdout);
  if (!run.ok()) {
    std::fprintf(stderr, "ckpt-scheduler: %s\n", run.ToString().c_str());
    return 1;
  }
  if (summary.ok() && summary->status == "failed") {
    std::fprintf(stderr,
                 "ckpt-scheduler: experiment %s failed; the reason is in the log above and in its "
                 "events\n",
                 config->name.c_str());
    return 1;
  }
  if (summary.ok() && summary->status != "done") {
    std::printf("stopped before the end; run the same command again to resume\n");
  }
  return 0;
}

int Serve(const std::string& config_path) {
  ckpt::Status s = ckpt::scheduler::RunService(config_path);
  if (s.ok()) return 0;
  std::fprintf(stderr, "ckpt-scheduler serve: %s\n", s.ToString().c_str());
  return s.IsInvalidArgument() || s.IsNotFound() ? 2 : 1;
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"ckpt-scheduler: population-based training with an embedded checkpoint store"};
  app.require_subcommand(1);
  std::string path, store, worker;
  bool quiet = false;
  int backoff_ms = -1, grace_ms = -1;
  CLI::App* run = app.add_subcommand("run", "run one experiment in the foreground (resumes it)");
  run->add_option("experiment", path, "experiment TOML file")->required();
  run->add_option("--store", store, "store directory (default: the file's `store`, else ./var)");
  run->add_option("--worker", worker, "path of ckpt-worker (default: next to this program)");
  run->add_option("--restart-backoff-ms", backoff_ms, "first worker restart delay (default 10000)");
  run->add_option("--grace-ms", grace_ms, "wait for in-flight intervals on stop (default 10000)");
  run->add_flag("--quiet", quiet, "no progress output");
  std::string service_config;
  CLI::App* serve = app.add_subcommand(
      "serve", "run as a service: experiments come and go through the control socket");
  serve->add_option("--config", service_config, "service configuration (deploy/scheduler.toml)")
      ->required();
  CLI11_PARSE(app, argc, argv);
  if (run->parsed()) return Run(path, store, worker, quiet, backoff_ms, grace_ms);
  if (serve->parsed()) return Serve(service_config);
  return 2;
}

// Process root: an escaping exception (none is expected; library calls return
// a Status) is reported and the process exits non-zero, so systemd's
// Restart=on-failure restarts it rather than it hanging.
int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-scheduler: unexpected exception: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "ckpt-scheduler: unexpected non-standard exception\n");
  }
  return 1;
}
