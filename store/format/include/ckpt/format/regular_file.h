// Reading a file that someone else names (a submitted experiment's TorchScript
// model) so that the file checked is the file read, and so that naming a FIFO,
// a device or a symbolic link cannot block or fool the reader.
//
// RegularFile::Open opens the path once with
// O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC|O_NOCTTY (a final symbolic link
// fails with ELOOP; opening a FIFO or a device does not wait for a peer), then
// checks the descriptor with fstat: a regular file of at most a given size.
// Every read goes through that descriptor, never through the path again, so
// replacing the file after the check changes nothing. Directories above the
// last component are still followed: a caller that must keep a path inside a
// directory resolves it first (realpath) and names the result, or opens it
// with OpenBeneath, which follows no symbolic link at all.
//
// Thread-safety: a RegularFile is used by one thread at a time; it is
// move-only and closes its descriptor when destroyed.
#ifndef CKPT_FORMAT_REGULAR_FILE_H_
#define CKPT_FORMAT_REGULAR_FILE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "ckpt/base/status.h"

namespace ckpt::format {

class RegularFile {
 public:
  // Opens and checks `path`. `what` names the file in messages ("TorchScript
  // file"). Errors, each naming `what` and `path`:
  //   NotFound         no such file (or a directory on the way is missing)
  //   InvalidArgument  a symbolic link (ELOOP); not a regular file (a FIFO, a
  //                    device, a socket, a directory); larger than `max_bytes`
  //   IOError          any other failure of open or fstat (permission
  //                    denied, ...), with the system's reason
  static StatusOr<RegularFile> Open(const std::string& path, uint64_t max_bytes,
                                    std::string_view what = "file");

  // How OpenBeneath resolves: openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS),
  // falling back to the walk where the kernel lacks openat2 (ENOSYS, before
  // Linux 5.6); or the walk alone (tests): one openat(O_NOFOLLOW) per
  // component, refusing a symbolic link, "." and "..".
  enum class Resolver { kOpenat2, kWalk };

  // Opens `relative` beneath the directory `dir` (itself opened by its path,
  // links included: it is the caller's trusted root) without following any
  // symbolic link and without leaving it, so that a link swapped in anywhere
  // on the way cannot redirect the open; then checks as Open does. Errors as
  // Open's, each naming `what`, `dir` and `relative`, and InvalidArgument for
  // a symbolic link on the way (ELOOP), a path leading out of `dir` (EXDEV,
  // "..") or an absolute `relative`; NotFound / IOError when `dir` cannot be
  // opened.
  static StatusOr<RegularFile> OpenBeneath(const std::string& dir, const std::string& relative,
                                           uint64_t max_bytes, std::string_view what = "file",
                                           Resolver resolver = Resolver::kOpenat2);

  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  // The size fstat reported at Open.
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // The first min(n, size()) bytes (fewer if the file shrank since Open).
  // IOError naming the file when a read fails.
  StatusOr<std::string> ReadPrefix(size_t n) const;

  // The whole file, read to its end through the descriptor. InvalidArgument
  // when it grew past the `max_bytes` given to Open; IOError when a read fails.
  StatusOr<std::string> ReadAll() const;

  // Hands the file's bytes to `sink` in order, in pieces of at most 1 MiB,
  // without holding the whole file. Errors as ReadAll's.
  Status ReadInPieces(const std::function<void(std::string_view)>& sink) const;

 private:
  // Checks the descriptor an open returned (`fd` >= 0) or reports the open's
  // `open_errno` (fd < 0); `named` is "<what> '<path>'" for messages.
  static StatusOr<RegularFile> Checked(int fd, int open_errno, const std::string& path,
                                       const std::string& named, uint64_t max_bytes,
                                       std::string_view what);
  RegularFile(int fd, uint64_t size, uint64_t max_bytes, std::string path, std::string what)
      : fd_(fd),
        size_(size),
        max_bytes_(max_bytes),
        path_(std::move(path)),
        what_(std::move(what)) {}
  // Reads up to `limit` bytes from offset 0 into a string, stopping at EOF.
  StatusOr<std::string> ReadUpTo(uint64_t limit) const;

  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t max_bytes_ = 0;
  std::string path_;
  std::string what_;
};

// RegularFile::Open(path, max_bytes, what), then ReadAll: the bytes of the
// file that was checked. Errors as theirs.
StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes,
                                      std::string_view what = "file");

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_REGULAR_FILE_H_
