#include "run_checks.h"

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "worker_pool.h"

namespace ckpt::scheduler {
namespace {

// The remote-worker flags over the file's [workers]: listening needs a secret,
// and a run without local workers needs to listen.
Status CheckRemoteWorkers(const RunFlags& f, records::RemoteWorkersConfig* remote) {
  if (!f.listen.empty()) remote->listen = f.listen;
  if (!f.secret_file.empty()) remote->secret_file = f.secret_file;
  if (f.no_local_workers) remote->local = false;
  if (!remote->listen.empty() && remote->secret_file.empty()) {
    return Status::InvalidArgument(
        "listening for workers needs --secret-file (or [workers] secret_file)");
  }
  if (!remote->local && remote->listen.empty()) {
    return Status::InvalidArgument(
        "without local workers, --listen (or [workers] listen) is needed");
  }
  return Status::OK();
}

// What can be known of the store path without creating it: Store::Open would
// fail later, after the store's parent directory was made.
Status CheckStorePath(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("store path is empty");
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_directory(st)) {
    return Status::InvalidArgument("store " + path + " exists and is not a directory");
  }
  return Status::OK();
}

}  // namespace

StatusOr<CheckedRun> CheckRun(const RunFlags& f) {
  CheckedRun out;
  CKPT_ASSIGN_OR_RETURN(out.config, records::LoadExperimentConfig(f.path));
  const records::ExperimentConfig& config = out.config;
  SchedulerOptions& options = out.options;
  options.store_path = f.store.empty() ? config.store : f.store;
  CKPT_RETURN_IF_ERROR(CheckStorePath(options.store_path));
  options.devices = config.devices;
  options.supervision = config.supervision;
  options.metrics = config.metrics;
  options.worker_binary = f.worker;
  options.progress = f.quiet ? nullptr : stdout;
  options.ring_bytes = static_cast<size_t>(f.ring_mib) << 20;
  options.blob_log = f.blob_log;
  if (f.backoff_ms >= 0) {
    options.supervision.restart_backoff = std::chrono::milliseconds(f.backoff_ms);
  }
  if (f.grace_ms >= 0) options.supervision.grace = std::chrono::milliseconds(f.grace_ms);
  CKPT_ASSIGN_OR_RETURN(options.kill_point, KillPointFromEnvironment());
  options.remote = config.workers;
  CKPT_RETURN_IF_ERROR(CheckRemoteWorkers(f, &options.remote));
  // As Scheduler::Create resolves it; resolved here, it is not looked up twice.
  if (options.remote.local && !ExpandDevices(options.devices).empty()) {
    CKPT_ASSIGN_OR_RETURN(options.worker_binary, FindWorkerBinary(options.worker_binary));
  }
  return out;
}

std::string CheckedLine(const records::ExperimentConfig& config) {
  const bool layer_list =
      !config.model_spec.empty() &&
      config.model_spec.find_first_of("[{") == config.model_spec.find_first_not_of(" \t\r\n");
  const std::string model = layer_list ? "a JSON layer list" : config.model_spec;
  return "ok: " + config.name + ": " + std::to_string(config.population) + " members, " + model +
         ", " + std::string(format::DatasetFormatName(config.data_format)) + ":" +
         config.dataset_path;
}

}  // namespace ckpt::scheduler
