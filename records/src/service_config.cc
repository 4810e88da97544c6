// records::ServiceConfig: the service file's parser (service_config.h).
#include "ckpt/records/service_config.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <toml++/toml.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "config_tables.h"
#include "toml_reader.h"
#include "workers_table.h"

namespace ckpt::records {
namespace {

using Reader = TomlTableReader;

bool AllDigits(const std::string& s) {
  if (s.empty() || s.size() > 10) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Whether a user or group name exists on this host (numeric ids always do).
bool NameResolves(const std::string& name, bool is_group) {
  if (AllDigits(name)) return true;
  std::vector<char> buf(16384);
  while (true) {
    int err;
    bool found;
    if (is_group) {
      struct group gr;
      struct group* res = nullptr;
      err = getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &res);
      found = res != nullptr;
    } else {
      passwd pw;
      passwd* res = nullptr;
      err = getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &res);
      found = res != nullptr;
    }
    if (err == ERANGE && buf.size() < (size_t{1} << 24)) {
      buf.resize(buf.size() * 2);
      continue;
    }
    return err == 0 && found;
  }
}

Status CheckNames(Reader* r, const toml::table& table, const std::string& key,
                  const std::vector<std::string>& names, bool is_group) {
  const toml::array* a = table.get(key) != nullptr ? table.get(key)->as_array() : nullptr;
  for (size_t i = 0; i < names.size(); ++i) {
    if (NameResolves(names[i], is_group)) continue;
    const toml::node* node = a != nullptr && i < a->size() ? a->get(i) : nullptr;
    return r->Error(key, node,
                    std::string("no ") + (is_group ? "group" : "user") + " named '" + names[i] +
                        "' on this host");
  }
  return Status::OK();
}

bool SameDevices(const std::vector<DeviceConfig>& a, const std::vector<DeviceConfig>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& x = a[i];
    const auto& y = b[i];
    if (x.device != y.device || x.count != y.count || x.slots != y.slots || x.fusion != y.fusion ||
        x.fusion_width != y.fusion_width || x.intra_op_threads != y.intra_op_threads ||
        x.tf32 != y.tf32) {
      return false;
    }
  }
  return true;
}

}  // namespace

StatusOr<ServiceConfig> ParseServiceConfig(const std::string& toml_text,
                                           const std::string& origin) {
  CKPT_ASSIGN_OR_RETURN(toml::table doc, ParseToml(toml_text, origin));
  ServiceConfig c;
  c.origin = origin;
  Reader top(doc, "", origin);
  CKPT_RETURN_IF_ERROR(top.String("store", &c.store));
  if (c.store.empty()) return top.Error("store", "must not be empty");
  CKPT_RETURN_IF_ERROR(top.String("runtime_directory", &c.runtime_directory));
  if (c.runtime_directory.empty()) return top.Error("runtime_directory", "must not be empty");
  CKPT_RETURN_IF_ERROR(top.String("socket", &c.socket));
  if (c.socket.empty()) c.socket = c.runtime_directory + "/control.sock";
  if (c.socket.size() > 107) {
    return top.Error(doc.get("socket") != nullptr ? "socket" : "runtime_directory",
                     "the socket path " + c.socket + " is longer than 107 bytes");
  }
  CKPT_RETURN_IF_ERROR(top.String("metrics", &c.metrics));
  if (!ValidListenAddress(c.metrics)) {
    return top.Error("metrics",
                     "must be host:port (port 1-65535) or \"\", not '" + c.metrics + "'");
  }
  CKPT_RETURN_IF_ERROR(top.Seconds("grace_s", 0, 86400, &c.supervision.grace));
  CKPT_RETURN_IF_ERROR(top.Bool("sync_interval_commits", &c.sync_interval_commits));
  CKPT_RETURN_IF_ERROR(top.Bool("blob_log", &c.blob_log));
  CKPT_RETURN_IF_ERROR(top.Int("final_eval_top", 0, 1000000, &c.final_eval_top));
  CKPT_RETURN_IF_ERROR(top.Bool("log_progress", &c.log_progress));
  if (doc.get("allowed_model_dirs") == nullptr) {
    std::error_code ec;
    const std::filesystem::path store = std::filesystem::absolute(c.store, ec);
    c.allowed_model_dirs = {((ec ? std::filesystem::path(c.store) : store) / "models").string()};
  }
  CKPT_RETURN_IF_ERROR(top.Strings("allowed_model_dirs", &c.allowed_model_dirs));
  for (const auto& d : c.allowed_model_dirs) {
    if (d.empty() || d[0] != '/') {
      return top.Error("allowed_model_dirs", "must list absolute directories, not '" + d + "'");
    }
  }

  if (doc.get("allowed_data_dirs") == nullptr) {
    std::error_code ec;
    const std::filesystem::path store = std::filesystem::absolute(c.store, ec);
    c.allowed_data_dirs = {((ec ? std::filesystem::path(c.store) : store) / "data").string()};
  }
  CKPT_RETURN_IF_ERROR(top.Strings("allowed_data_dirs", &c.allowed_data_dirs));
  for (const auto& d : c.allowed_data_dirs) {
    if (d.empty() || d[0] != '/') {
      return top.Error("allowed_data_dirs", "must list absolute directories, not '" + d + "'");
    }
  }

  CKPT_ASSIGN_OR_RETURN(const toml::table* control, top.Table("control"));
  if (control != nullptr) {
    Reader r(*control, "control", origin);
    CKPT_RETURN_IF_ERROR(r.Strings("allowed_users", &c.allowed_users));
    CKPT_RETURN_IF_ERROR(CheckNames(&r, *control, "allowed_users", c.allowed_users, false));
    CKPT_RETURN_IF_ERROR(r.Strings("allowed_groups", &c.allowed_groups));
    CKPT_RETURN_IF_ERROR(CheckNames(&r, *control, "allowed_groups", c.allowed_groups, true));
    CKPT_RETURN_IF_ERROR(r.Strings("admins", &c.admins));
    CKPT_RETURN_IF_ERROR(CheckNames(&r, *control, "admins", c.admins, false));
    int64_t max_request = static_cast<int64_t>(c.max_request_bytes);
    CKPT_RETURN_IF_ERROR(r.Int("max_request_bytes", 1024, int64_t{1} << 30, &max_request));
    c.max_request_bytes = static_cast<size_t>(max_request);
    CKPT_RETURN_IF_ERROR(r.Int("max_clients", 1, 100000, &c.max_clients));
    CKPT_RETURN_IF_ERROR(r.Seconds("client_idle_timeout_s", 0.01, 86400, &c.client_idle_timeout));
    CKPT_RETURN_IF_ERROR(
        r.Seconds("submit_validation_timeout_s", 0.01, 86400, &c.submit_validation_timeout));
    CKPT_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  }
  CKPT_ASSIGN_OR_RETURN(const toml::table* workers, top.Table("workers"));
  if (workers != nullptr) {
    Reader r(*workers, "workers", origin);
    CKPT_RETURN_IF_ERROR(r.String("binary", &c.worker_binary));
    int64_t ring_mib = static_cast<int64_t>(c.ring_bytes >> 20);
    CKPT_RETURN_IF_ERROR(r.Int("ring_mib", 1, 16384, &ring_mib));
    c.ring_bytes = static_cast<size_t>(ring_mib) << 20;
    CKPT_RETURN_IF_ERROR(
        r.Seconds("heartbeat_timeout_s", 0.1, 86400, &c.supervision.heartbeat_timeout));
    CKPT_RETURN_IF_ERROR(ReadSupervision(&r, &c.supervision));
    CKPT_RETURN_IF_ERROR(ReadRemoteWorkers(&r, &c.remote));
    CKPT_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  }
  CKPT_RETURN_IF_ERROR(ReadDevices(&top, origin, "auto", &c.devices));
  if (c.devices.empty()) {
    DeviceConfig d;
    d.device = "auto";
    c.devices.push_back(d);
  }
  CKPT_RETURN_IF_ERROR(top.CheckNoUnknownKeys());
  return c;
}

StatusOr<ServiceConfig> LoadServiceConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 && errno == ENOENT) {
      return Status::NotFound("service configuration " + path + " does not exist");
    }
    return Status::IOError("cannot read service configuration " + path);
  }
  std::string text;
  if (!ReadBoundedToml(in, &text)) return Status::IOError("reading service configuration " + path);
  return ParseServiceConfig(text, path);
}

std::string SettingsNeedingRestart(const ServiceConfig& a, const ServiceConfig& b) {
  std::vector<std::string> changed;
  if (a.store != b.store) changed.push_back("store");
  if (a.socket != b.socket) changed.push_back("socket");
  if (a.metrics != b.metrics) changed.push_back("metrics");
  if (!SameDevices(a.devices, b.devices)) changed.push_back("devices");
  if (a.supervision.grace != b.supervision.grace) changed.push_back("grace_s");
  if (a.sync_interval_commits != b.sync_interval_commits) {
    changed.push_back("sync_interval_commits");
  }
  if (a.blob_log != b.blob_log) changed.push_back("blob_log");
  if (a.final_eval_top != b.final_eval_top) changed.push_back("final_eval_top");
  if (a.log_progress != b.log_progress) changed.push_back("log_progress");
  const SupervisionOptions& x = a.supervision;
  const SupervisionOptions& y = b.supervision;
  if (a.worker_binary != b.worker_binary || a.ring_bytes != b.ring_bytes ||
      x.heartbeat_timeout != y.heartbeat_timeout || x.restart_backoff != y.restart_backoff ||
      x.max_restart_backoff != y.max_restart_backoff || x.healthy_reset != y.healthy_reset ||
      x.max_restarts != y.max_restarts || x.max_member_failures != y.max_member_failures ||
      a.remote.listen != b.remote.listen || a.remote.secret_file != b.remote.secret_file ||
      a.remote.local != b.remote.local || a.remote.max_remote != b.remote.max_remote ||
      a.remote.remote_memory_bytes != b.remote.remote_memory_bytes ||
      a.remote.max_remote_slots != b.remote.max_remote_slots ||
      a.remote.task_timeout_factor != b.remote.task_timeout_factor ||
      a.remote.task_timeout_floor != b.remote.task_timeout_floor) {
    changed.push_back("[workers]");
  }
  std::string out;
  for (const auto& s : changed) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace ckpt::records
