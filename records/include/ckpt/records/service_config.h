// ServiceConfig: the configuration file of `ckpt-scheduler serve`
// (ckpt/scheduler/service.h runs it), parsed here with the experiment file's
// TOML reader so that toml++ stays private to ckpt::records.
//
//   store = "/var/lib/ckpt/store"       # the embedded store (one scheduler per store)
//   runtime_directory = "/run/ckpt"     # created 0750 when missing
//   socket = ""                         # "" = <runtime_directory>/control.sock
//   metrics = "127.0.0.1:9464"          # host:port of the Prometheus endpoint, "" = none
//   grace_s = 30                        # SIGTERM: wait this long for in-flight intervals
//   sync_interval_commits = false
//   blob_log = true                     # new states in the store's own blob log
//   final_eval_top = 5
//   log_progress = true                 # a progress line per experiment every 10 s
//   allowed_model_dirs = ["/var/lib/ckpt/models"]   # default: ["<store>/models"]
//   allowed_data_dirs = ["/var/lib/ckpt/data"]      # default: ["<store>/data"]
//   [control]  allowed_users = ["alice"]; allowed_groups = ["ckpt"]; admins = ["bob"];
//              max_request_bytes = 1048576; max_clients = 64; client_idle_timeout_s = 30;
//              submit_validation_timeout_s = 20
//   [workers]  binary = ""; ring_mib = 64; heartbeat_timeout_s = 10; restart_backoff_s = 10;
//              max_restart_backoff_s = 300; healthy_reset_s = 600; max_restarts = 10;
//              max_member_failures = 3; listen = ""; secret_file = ""; local = true
//              (workers on other hosts; RemoteWorkersConfig in config.h)
//   [[devices]] device = "auto"; count = 1; slots = 4; fusion = "auto"; fusion_width = 8;
//               intra_op_threads = 1; tf32 = false  (as in experiment files)
//
// Every key is checked: an unknown key, a wrong type or a bad value is an
// InvalidArgument naming the key and its line ("control.max_clients
// (/etc/ckpt/scheduler.toml line 12): must be in [1, 100000], not 0"). User and
// group names must resolve on this host (numeric ids are taken as they are).
//
// allowed_model_dirs: a submitted experiment whose model is
// "torchscript:PATH" is refused unless PATH, written as an absolute path with
// no symbolic link or "..", lies inside one of these directories (resolved);
// see records::CheckModelFileAllowed. Every user allowed on the control socket
// can make the workers run the code of any TorchScript file there: list only
// directories that the service's administrators alone can write. [] refuses
// every TorchScript model. `ckpt-scheduler run` (the user's own experiment
// file, no control socket) has no such rule: it loads any file its user can
// read.
//
// allowed_data_dirs: likewise for a submitted experiment's [data] path (a
// tensor file inside one of them, or an IDX directory that is one of them or
// inside one; records::CheckDataPathAllowed). The built-in data sets (no
// path) are always allowed. Without it, any control-socket user could make
// the service read any file it can read (the workers' secret included).
// [] allows only the built-in data sets.
//
// Thread-safety: ServiceConfig is a value; the functions are reentrant.
#ifndef CKPT_RECORDS_SERVICE_CONFIG_H_
#define CKPT_RECORDS_SERVICE_CONFIG_H_

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"

namespace ckpt::records {

struct ServiceConfig {
  // Store directory. Default: "/var/lib/ckpt/store".
  std::string store = "/var/lib/ckpt/store";
  // Directory of the control socket. Default: "/run/ckpt".
  std::string runtime_directory = "/run/ckpt";
  // Control socket. Default: <runtime_directory>/control.sock.
  std::string socket;
  // Prometheus endpoint, host:port; "" = none. Default: "127.0.0.1:9464".
  std::string metrics = "127.0.0.1:9464";
  // Workers. Default: one "auto" entry (every GPU, else the CPU).
  std::vector<DeviceConfig> devices;
  // See ControlOptions; the limits and peers of the control socket.
  std::vector<std::string> allowed_users;
  std::vector<std::string> allowed_groups;
  // [control] admins: who may change any experiment and shut the service
  // down (ControlOptions::admins). Default: none (root and the service's user).
  std::vector<std::string> admins;
  size_t max_request_bytes = size_t{1} << 20;
  int max_clients = 64;
  std::chrono::milliseconds client_idle_timeout{30000};
  // [control] submit_validation_timeout_s (ControlOptions). Default: 20 s.
  std::chrono::milliseconds submit_validation_timeout{20000};
  // grace_s and [workers]. Defaults: as in SupervisionOptions, except grace 30 s.
  SupervisionOptions supervision = [] {
    SupervisionOptions s;
    s.grace = std::chrono::milliseconds(30000);
    return s;
  }();
  // See SchedulerOptions for these.
  bool sync_interval_commits = false;
  // New states go to the store's own blob log, written once
  // (store::StoreOptions::blob_log); false: RocksDB's blob files. Default: true.
  bool blob_log = true;
  int final_eval_top = 5;
  bool log_progress = true;
  std::string worker_binary;
  size_t ring_bytes = kDefaultRingBytes;
  // [workers] listen, secret_file, local: workers on other hosts.
  RemoteWorkersConfig remote;
  // Directories a submitted TorchScript model must lie in (absolute; see
  // above). Default: {"<store>/models"}.
  std::vector<std::string> allowed_model_dirs;
  // Where a submitted experiment's data must lie (absolute; see above).
  // Default: {"<store>/data"}.
  std::vector<std::string> allowed_data_dirs;
  // Where the configuration was read from (for messages and reloads).
  std::string origin;
};

// Parses and validates a service configuration. `origin` names it in errors.
StatusOr<ServiceConfig> ParseServiceConfig(const std::string& toml_text, const std::string& origin);
// Reads and parses a file; NotFound / IOError naming the path.
StatusOr<ServiceConfig> LoadServiceConfig(const std::string& path);

// Names the settings that differ between `running` and `reloaded` and that a
// reload cannot apply ("store, devices"); "" when there are none.
std::string SettingsNeedingRestart(const ServiceConfig& running, const ServiceConfig& reloaded);

}  // namespace ckpt::records

#endif  // CKPT_RECORDS_SERVICE_CONFIG_H_
