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
// directory resolves it first (realpath) and names the result.
//
// Thread-safety: a RegularFile is used by one thread at a time; it is
// move-only and closes its descriptor when destroyed.
#ifndef CKPT_FORMAT_REGULAR_FILE_H_
#define CKPT_FORMAT_REGULAR_FILE_H_

#include <cstddef>
#include <cstdint>
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

 private:
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
