// The service's rules for the files a submitted experiment names, beside
// CheckModelFileAllowed (config.h): its data must lie in allowed_data_dirs
// (ServiceConfig), judged by path before anything opens it.
//
// A path is judged as written and as resolved (realpath of its existing part):
// it must be absolute, lie inside one of the allowed directories once
// resolved, and be written with no symbolic link or ".." (so that the open
// that follows, which refuses a final symbolic link, reaches the file judged
// unless someone who may write inside an allowed directory changes it).
// Errors name `origin`, the key, the path, what it resolves to and the
// allowed directories, never the file's bytes.
//
// ModelFileSha256 pins a TorchScript model: the hash of the bytes of the file
// judged, which CONFIGURE carries to every worker (ipc::Configure::
// model_sha256), local or remote, each of which refuses a file that hashes
// otherwise.
//
// Thread-safety: pure functions of the file system's state; reentrant.
#ifndef CKPT_RECORDS_ALLOWED_PATHS_H_
#define CKPT_RECORDS_ALLOWED_PATHS_H_

#include <optional>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"

namespace ckpt::records {

// allowed_data_dirs: the [data] path of `config` (parsed with
// FileChecks::kSkip) must be a tensor file inside one of `allowed_dirs`, or an
// IDX directory that is one of them or inside one. The built-in data sets
// (IDX, no path given: /usr/share/datasets/<dataset>) are always allowed.
// InvalidArgument naming "data.path", the path, its resolved form and the
// directories otherwise ("none" when the list is empty).
Status CheckDataPathAllowed(const ExperimentConfig& config,
                            const std::vector<std::string>& allowed_dirs,
                            const std::string& origin);

// The SHA-256 (64 hex digits) of the TorchScript file of `model_spec`, read
// through one descriptor in pieces; "" for a spec that names no file. With
// `allowed_dirs` (the service) the file is opened beneath the allowed
// directory that holds it (format::RegularFile::OpenBeneath: openat2 with
// RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or a walk of O_NOFOLLOW opens), so
// no link swapped in after CheckModelFileAllowed can redirect it. REQUIRES:
// that check passed. Without (`ckpt-scheduler run`) it is opened by its path
// (format::RegularFile::Open). Errors name `origin`, "model.spec" and the
// file: InvalidArgument (a link on the way, not a regular file, too large,
// outside every directory), NotFound, IOError.
StatusOr<std::string> ModelFileSha256(const std::string& model_spec,
                                      const std::optional<std::vector<std::string>>& allowed_dirs,
                                      const std::string& origin);

}  // namespace ckpt::records

#endif  // CKPT_RECORDS_ALLOWED_PATHS_H_
