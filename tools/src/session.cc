#include "session.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

namespace ckpt::tool {
namespace {

namespace fs = std::filesystem;

bool IsDirectory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

std::string Canonical(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? path : p.string();
}

}  // namespace

std::string DefaultSocket() {
  const char* env = std::getenv("CKPT_SOCKET");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(kServiceSocket);
}

int ExitCodeFor(const Status& status) {
  if (status.ok()) return kExitOk;
  if (status.IsInvalidArgument()) return kExitUsage;
  return kExitFailed;
}

StatusOr<std::string> Session::StorePath() {
  if (store_path_) return *store_path_;
  if (!options_.store_path.empty()) {
    if (!IsDirectory(options_.store_path)) {
      return Status::NotFound("store " + options_.store_path + ": no such directory");
    }
    store_path_ = options_.store_path;
    return *store_path_;
  }
  if (options_.socket_path.empty()) {
    if (IsDirectory(kDefaultStore)) {
      store_path_ = kDefaultStore;
      return *store_path_;
    }
    if (IsDirectory(kServiceStore)) {
      store_path_ = kServiceStore;
      return *store_path_;
    }
  }
  // Ask the scheduler at the socket which store it serves.
  const std::string socket = options_.socket_path.empty() ? DefaultSocket() : options_.socket_path;
  auto client = ConnectTo(socket);
  if (client.ok()) {
    auto all = (*client)->AllExperimentStatus();
    if (all.ok()) {
      for (const auto& e : *all) {
        if (!e.store_path.empty()) {
          store_path_ = e.store_path;
          return *store_path_;
        }
      }
    }
  }
  if (!options_.socket_path.empty()) {
    if (!client.ok()) return client.status();
    return Status::NotFound("the scheduler at " + socket +
                            " names no store (it runs no experiment); give --store DIR");
  }
  return Status::NotFound(std::string("no store: neither ./") + kDefaultStore + " nor " +
                          kServiceStore + " exists and no scheduler answers at " + socket +
                          "; give --store DIR");
}

StatusOr<store::Store*> Session::Reader() {
  if (reader_) return reader_.get();
  CKPT_ASSIGN_OR_RETURN(std::string path, StorePath());
  store::StoreOptions o;
  o.path = path;
  o.create_if_missing = false;
  // A command reads each blob about once.
  o.blob_cache_bytes = size_t{16} << 20;
  auto s = store::Store::OpenReadOnly(o);
  if (!s.ok()) {
    if (s.status().IsNotFound()) {
      return Status::NotFound(path + " is not a ckpt store: " + s.status().message());
    }
    return Status::NotFound(path + " is not a readable ckpt store: " + s.status().ToString());
  }
  reader_ = std::move(*s);
  return reader_.get();
}

Status Session::RefreshReader() {
  if (!reader_) return Reader().status();
  return reader_->Refresh();
}

StatusOr<std::unique_ptr<store::Store>> Session::OpenWriter(store::StoreOptions options) {
  CKPT_ASSIGN_OR_RETURN(std::string path, StorePath());
  // Reading first tells a directory that is no store from one that is busy.
  CKPT_RETURN_IF_ERROR(Reader().status());
  reader_.reset();
  options.path = path;
  options.create_if_missing = false;
  auto s = store::Store::Open(options);
  if (!s.ok()) {
    if (s.status().IsUnavailable()) {
      return Status::FailedPrecondition(
          "store " + path + " is held by a running scheduler with no control socket answering" +
          " (stop it, or run `ckpt-scheduler serve` and give --socket): " + s.status().message());
    }
    return s.status();
  }
  return std::move(*s);
}

StatusOr<std::unique_ptr<scheduler::ControlClient>> Session::ConnectTo(const std::string& path) {
  scheduler::ControlClientOptions o;
  o.socket_path = path;
  o.timeout = std::chrono::milliseconds(10000);
  auto c = scheduler::ControlClient::Connect(o);
  if (!c.ok()) {
    return Status(c.status().code(), "control socket " + path + ": " + c.status().message());
  }
  return std::move(*c);
}

StatusOr<scheduler::ControlClient*> Session::Control() {
  if (control_resolved_) return control_.get();
  control_resolved_ = true;
  if (!options_.socket_path.empty()) {
    CKPT_ASSIGN_OR_RETURN(control_, ConnectTo(options_.socket_path));
    return control_.get();
  }
  auto c = ConnectTo(DefaultSocket());
  if (!c.ok()) return static_cast<scheduler::ControlClient*>(nullptr);
  // The default socket counts only when its scheduler serves our store.
  auto path = StorePath();
  auto all = (*c)->AllExperimentStatus();
  if (!path.ok() || !all.ok()) return static_cast<scheduler::ControlClient*>(nullptr);
  for (const auto& e : *all) {
    if (!e.store_path.empty() && Canonical(e.store_path) == Canonical(*path)) {
      control_ = std::move(*c);
      return control_.get();
    }
  }
  return static_cast<scheduler::ControlClient*>(nullptr);
}

StatusOr<store::Manifest> Session::ResolveManifest(const MemberRef& ref) {
  CKPT_ASSIGN_OR_RETURN(store::Store * s, Reader());
  auto head = s->GetMember(ref.exp, ref.member);
  if (!head.ok()) {
    if (head.status().IsNotFound()) {
      if (!s->GetExperiment(ref.exp).ok()) {
        return Status::NotFound("experiment " + ref.exp + " not found");
      }
      return Status::NotFound("member " + ref.member + " of experiment " + ref.exp + " not found");
    }
    return head.status();
  }
  const int64_t version = ref.version ? *ref.version : head->version;
  if (version == 0) {
    return Status::NotFound(ref.exp + "/" + ref.member + " has no version yet");
  }
  auto m = s->GetManifest(ref.exp, ref.member, version);
  if (!m.ok() && m.status().IsNotFound()) {
    return Status::NotFound(ref.exp + "/" + VersionName(ref.member, version) +
                            " not found (head is version " + std::to_string(head->version) +
                            "; older versions may have been deleted by retention)");
  }
  return m;
}

StatusOr<ExperimentSettings> ReadExperimentSettings(const store::ExperimentInfo& info) {
  auto toml = records::DecodeExperimentToml(info.config_json, info.id);
  if (!toml.ok()) return ExperimentSettings{};
  auto config =
      records::ParseExperimentConfig(*toml, "experiment " + info.id, records::FileChecks::kSkip);
  if (!config.ok()) {
    return Status::Corruption("experiment " + info.id +
                              ": its configuration does not parse: " + config.status().message());
  }
  return std::move(config).value();
}

records::MemberRecord ReadMemberRecord(const store::MemberHead& head) {
  auto record = records::DecodeMemberRecord(head.state, "", head.member);
  return record.ok() ? *record : records::MemberRecord{};
}

records::MemberStatus ShownMemberStatus(const records::MemberRecord& record, int intervals,
                                        const std::string& experiment_status) {
  if (records::Finished(record.status)) return record.status;
  if (intervals > 0 && record.interval >= intervals) return records::MemberStatus::kDone;
  auto experiment = records::ParseExperimentStatus(experiment_status);
  if (experiment.ok() && *experiment == records::ExperimentStatus::kRunning) {
    return records::MemberStatus::kRunning;
  }
  return records::MemberStatus::kIdle;
}

std::string FormatNumber(double value) {
  if (std::isnan(value)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", value);
  return buf;
}

std::string FormatScore(double score) {
  if (!std::isfinite(score)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", score);
  return buf;
}

std::string FormatHparams(const std::map<std::string, double>& hparams) {
  std::string s;
  for (const auto& [k, v] : hparams) {
    if (!s.empty()) s += " ";
    s += k + "=" + FormatNumber(v);
  }
  return s.empty() ? "-" : s;
}

std::string FormatShape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string FormatTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string FormatBytes(uint64_t bytes) {
  char buf[32];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else if (bytes < (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", bytes / 1024.0);
  } else if (bytes < (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / 1048576.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / 1073741824.0);
  }
  return buf;
}

std::string VersionName(const std::string& member, int64_t version) {
  return member + "@" + std::to_string(version);
}

Status Print(FILE* out, const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), out) != text.size() || std::fflush(out) != 0) {
    return Status::IOError(std::string("cannot write the output: ") + std::strerror(errno));
  }
  return Status::OK();
}

}  // namespace ckpt::tool
