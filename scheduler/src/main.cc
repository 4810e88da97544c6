// ckpt-scheduler: runs population-based training experiments.
//
//   ckpt-scheduler run EXPERIMENT.toml [--store DIR] [--ring-mib N] [--quiet]
//                      [--listen HOST:PORT --secret-file PATH] [--no-local-workers]
//                      [--summary-json PATH]
//   ckpt-scheduler check EXPERIMENT.toml [--store DIR] [--worker PATH] [--listen HOST:PORT
//                        --secret-file PATH] [--no-local-workers]
//   ckpt-scheduler serve --config /etc/ckpt/scheduler.toml
//
// Thin: parses flags, fills SchedulerOptions, calls the library.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <fstream>
#include <utility>

#include "ckpt/records/config.h"
#include "ckpt/scheduler/scheduler.h"
#include "ckpt/scheduler/service.h"
#include "control_protocol.h"
#include "run_checks.h"

namespace {

using ckpt::scheduler::RunFlags;

// Writes the final summary as the control protocol's `status` JSON (with its
// members), so programs (ckpt-bench seed) read it rather than the table.
bool WriteSummaryJson(const ckpt::scheduler::ExperimentSummary& summary, const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  out << ckpt::scheduler::protocol::SummaryToJson(summary, /*with_members=*/true).dump() << "\n";
  out.flush();
  if (out) return true;
  std::fprintf(stderr, "ckpt-scheduler: cannot write the summary to %s\n", path.c_str());
  return false;
}

int Run(const RunFlags& f) {
  auto checked = ckpt::scheduler::CheckRun(f);
  if (!checked.ok()) {
    std::fprintf(stderr, "ckpt-scheduler: %s\n", checked.status().ToString().c_str());
    return 2;
  }
  const ckpt::records::ExperimentConfig& config = checked->config;
  auto scheduler = ckpt::scheduler::Scheduler::Create(checked->options);
  if (!scheduler.ok()) {
    const ckpt::Status& s = scheduler.status();
    std::fprintf(stderr, "ckpt-scheduler: %s\n", s.ToString().c_str());
    // A mistake in the command or the file: as Serve's.
    return s.IsInvalidArgument() || s.IsNotFound() ? 2 : 1;
  }
  if (auto s = (*scheduler)->Submit(config); !s.ok()) {
    std::fprintf(stderr, "ckpt-scheduler: %s\n", s.ToString().c_str());
    return 1;
  }
  ckpt::Status run = (*scheduler)->Run();
  auto summary = (*scheduler)->Summary(config.name);
  if (summary.ok()) ckpt::scheduler::PrintSummary(*summary, stdout);
  if (summary.ok() && !f.summary_json.empty() && !WriteSummaryJson(*summary, f.summary_json)) {
    return 1;
  }
  if (!run.ok()) {
    std::fprintf(stderr, "ckpt-scheduler: %s\n", run.ToString().c_str());
    return 1;
  }
  if (summary.ok() && summary->status == ckpt::records::ExperimentStatus::kFailed) {
    std::fprintf(stderr,
                 "ckpt-scheduler: experiment %s failed; the reason is in the log above and in its "
                 "events\n",
                 config.name.c_str());
    return 1;
  }
  if (summary.ok() && summary->status != ckpt::records::ExperimentStatus::kDone) {
    std::printf("stopped before the end; run the same command again to resume\n");
  }
  return 0;
}

// `check`: CheckRun alone; creates nothing.
int Check(const RunFlags& f) {
  auto checked = ckpt::scheduler::CheckRun(f);
  if (!checked.ok()) {
    std::fprintf(stderr, "ckpt-scheduler: %s\n", checked.status().ToString().c_str());
    return 2;
  }
  std::printf("%s\n", ckpt::scheduler::CheckedLine(checked->config).c_str());
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
  RunFlags f;
  CLI::App* run = app.add_subcommand("run", "run one experiment in the foreground (resumes it)");
  run->add_option("experiment", f.path, "experiment TOML file")->required();
  run->add_option("--store", f.store, "store directory (default: the file's `store`, else ./var)");
  run->add_option("--worker", f.worker,
                  "ckpt-worker to start: a path, or a name on PATH (default: $CKPT_WORKER, "
                  "else the one next to this program, else ckpt-worker on PATH)");
  run->add_option("--restart-backoff-ms", f.backoff_ms,
                  "first worker restart delay (default 10000)");
  run->add_option("--grace-ms", f.grace_ms, "wait for in-flight intervals on stop (default 10000)");
  run->add_option("--ring-mib", f.ring_mib,
                  "each worker's two shared-memory rings, MiB each: the most each may use "
                  "(its memory grows with the states sent, to four of them); states larger "
                  "than half a ring travel in fragments")
      ->check(CLI::Range(1, 16384))
      ->capture_default_str();
  run->add_flag("--quiet", f.quiet, "no progress output");
  run->add_option("--listen", f.listen,
                  "accept ckpt-worker --connect workers on HOST:PORT (port 0: ephemeral; "
                  "overrides [workers] listen)");
  run->add_option("--secret-file", f.secret_file,
                  "the secret connecting workers must prove (0600; created when absent)");
  run->add_flag("--no-local-workers", f.no_local_workers,
                "spawn no local workers: only connected ones train");
  run->add_flag("--blob-log,!--no-blob-log", f.blob_log,
                "keep new states in the store's own blob log, written once (the default; "
                "store.h StoreOptions::blob_log); --no-blob-log or --blob-log=false keeps "
                "them in RocksDB's blob files");
  run->add_option("--summary-json", f.summary_json,
                  "also write the final summary (members best first) as JSON to this file");
  RunFlags c;
  CLI::App* check = app.add_subcommand(
      "check",
      "make every check `run` makes before it creates anything (the experiment file, its data "
      "and model files, the worker options) and create nothing: prints `ok: NAME: N members, "
      "MODEL, FORMAT:DATA` and exits 0, or prints run's error and exits 2");
  check->add_option("experiment", c.path, "experiment TOML file")->required();
  check->add_option("--store", c.store, "store directory, as run's (it must not be a file)");
  check->add_option("--worker", c.worker, "ckpt-worker, as run's (it must be there)");
  check->add_option("--listen", c.listen, "as run's");
  check->add_option("--secret-file", c.secret_file, "as run's");
  check->add_flag("--no-local-workers", c.no_local_workers, "as run's");
  std::string service_config;
  CLI::App* serve = app.add_subcommand(
      "serve", "run as a service: experiments come and go through the control socket");
  serve->add_option("--config", service_config, "service configuration (deploy/scheduler.toml)")
      ->required();
  CLI11_PARSE(app, argc, argv);
  if (run->parsed()) return Run(f);
  if (check->parsed()) return Check(c);
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
