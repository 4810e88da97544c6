// records::CheckDataPathAllowed (allowed_paths.h).
#include "ckpt/records/allowed_paths.h"

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

#include "ckpt/format/model_names.h"
#include "ckpt/format/regular_file.h"
#include "ckpt/ipc/sha256.h"

namespace ckpt::records {
namespace {

namespace fs = std::filesystem;

// The data sets a [data] table without a path reads (ReadDataTable's
// defaults): installed with the system, named by no user.
bool IsBuiltinDataDir(const ExperimentConfig& config) {
  return config.data_format == format::DatasetFormat::kIdx &&
         config.dataset_path == "/usr/share/datasets/" + config.dataset;
}

// Whether `resolved` lies inside `dir` (or is `dir`, when `dir_itself` is
// allowed). A trailing "" element of "dir/" matches anything.
bool Inside(const fs::path& dir, const fs::path& resolved, bool dir_itself) {
  auto [dit, rit] = std::mismatch(dir.begin(), dir.end(), resolved.begin(), resolved.end());
  const bool prefix = dit == dir.end() || (std::next(dit) == dir.end() && dit->empty());
  return prefix && (dir_itself || rit != resolved.end());
}

// The path rule of allowed_paths.h for one path; `refused` starts each error.
Status CheckInside(const std::string& path, const std::vector<std::string>& allowed_dirs,
                   bool dir_itself, const std::string& refused_head) {
  std::string dirs;
  std::vector<fs::path> resolved_dirs;
  for (const auto& d : allowed_dirs) {
    std::error_code ec;
    fs::path r = fs::weakly_canonical(fs::absolute(d, ec), ec);
    if (ec) continue;  // a directory that cannot be resolved admits nothing
    dirs += (dirs.empty() ? "" : ", ") + r.string();
    resolved_dirs.push_back(std::move(r));
  }
  if (dirs.empty()) dirs = "none";
  const std::string refused = refused_head + " [" + dirs + "] (its configuration file sets them); ";
  // "dir/" names dir: judged and compared without its trailing slashes.
  std::string written = path;
  while (written.size() > 1 && written.back() == '/') written.pop_back();
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(fs::absolute(written, ec), ec);
  if (ec) {
    return Status::InvalidArgument(refused + "'" + path + "' cannot be resolved: " + ec.message());
  }
  if (!fs::path(path).is_absolute()) {
    return Status::InvalidArgument(refused + "'" + path +
                                   "' is a relative path (from the scheduler's directory it "
                                   "resolves to " +
                                   resolved.string() + "); name it by its absolute path");
  }
  const bool inside =
      std::any_of(resolved_dirs.begin(), resolved_dirs.end(),
                  [&](const fs::path& d) { return Inside(d, resolved, dir_itself); });
  if (!inside) {
    return Status::InvalidArgument(refused + "'" + path + "' resolves to " + resolved.string() +
                                   ", which is outside them");
  }
  // The later open follows the path as written: a link or ".." in it could
  // be changed to lead elsewhere between this check and that open.
  if (fs::path(written) != resolved) {
    return Status::InvalidArgument(refused + "'" + path + "' resolves to " + resolved.string() +
                                   " through a symbolic link or \"..\"; name it by that resolved "
                                   "path");
  }
  return Status::OK();
}

}  // namespace

Status CheckDataPathAllowed(const ExperimentConfig& config,
                            const std::vector<std::string>& allowed_dirs,
                            const std::string& origin) {
  if (IsBuiltinDataDir(config)) return Status::OK();
  const bool idx = config.data_format == format::DatasetFormat::kIdx;
  return CheckInside(config.dataset_path, allowed_dirs, /*dir_itself=*/idx,
                     origin + ": data.path: the service reads " +
                         (idx ? "IDX directories" : "tensor files") +
                         " only from allowed_data_dirs");
}

StatusOr<std::string> ModelFileSha256(const std::string& model_spec,
                                      const std::optional<std::vector<std::string>>& allowed_dirs,
                                      const std::string& origin) {
  if (model_spec.compare(0, format::kTorchScriptPrefix.size(), format::kTorchScriptPrefix) != 0) {
    return std::string();
  }
  const std::string path = model_spec.substr(format::kTorchScriptPrefix.size());
  const std::string head = origin + ": model.spec: ";
  StatusOr<format::RegularFile> file = Status::InvalidArgument(
      head + "'" + path + "' lies in none of allowed_model_dirs (it changed since it was judged)");
  if (!allowed_dirs) {
    file = format::RegularFile::Open(path, format::kMaxTorchScriptFileBytes, "TorchScript file");
  } else {
    for (const auto& d : *allowed_dirs) {
      std::error_code ec;
      const fs::path dir = fs::weakly_canonical(fs::absolute(d, ec), ec);
      if (ec || !Inside(dir, fs::path(path), /*dir_itself=*/false)) continue;
      file = format::RegularFile::OpenBeneath(dir.string(),
                                              fs::path(path).lexically_relative(dir).string(),
                                              format::kMaxTorchScriptFileBytes, "TorchScript file");
      break;
    }
  }
  if (!file.ok()) return Status(file.status().code(), head + file.status().message());
  ipc::Sha256Hasher hasher;
  Status read = file->ReadInPieces([&](std::string_view piece) { hasher.Update(piece); });
  if (!read.ok()) return Status(read.code(), head + read.message());
  return hasher.FinalHex();
}

}  // namespace ckpt::records
