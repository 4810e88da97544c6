#include "ckpt/format/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

namespace ckpt::format {
namespace {

// "a FIFO", "a directory", ... for a file type that is not a regular file.
const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "of an unknown type";
}

}  // namespace

StatusOr<RegularFile> RegularFile::Open(const std::string& path, uint64_t max_bytes,
                                        std::string_view what) {
  const std::string named = std::string(what) + " '" + path + "'";
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(named + ": no such file");
    if (err == ELOOP) {
      return Status::InvalidArgument(named + " is a symbolic link (refused: name the file itself)");
    }
    return Status::IOError(named + ": cannot open: " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IOError(named + ": fstat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(named + " is not a regular file (it is " + KindOf(st.st_mode) +
                                   ")");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    return Status::InvalidArgument(named + " is " + std::to_string(size) + " bytes; the limit is " +
                                   std::to_string(max_bytes));
  }
  return RegularFile(fd, size, max_bytes, path, std::string(what));
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      size_(other.size_),
      max_bytes_(other.max_bytes_),
      path_(std::move(other.path_)),
      what_(std::move(other.what_)) {}

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    max_bytes_ = other.max_bytes_;
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::string> RegularFile::ReadUpTo(uint64_t limit) const {
  std::string out;
  // The size fstat gave is a hint: the file may have shrunk or grown since.
  out.resize(static_cast<size_t>(std::min(limit, size_)));
  uint64_t at = 0;
  while (at < limit) {
    if (at == out.size()) {
      // Grown past the first size: read on in 1 MiB steps up to the limit.
      out.resize(static_cast<size_t>(std::min<uint64_t>(limit, at + (uint64_t{1} << 20))));
    }
    const ssize_t n = ::pread(fd_, out.data() + at, out.size() - at, static_cast<off_t>(at));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(what_ + " '" + path_ + "': read: " + std::strerror(errno));
    }
    if (n == 0) break;
    at += static_cast<uint64_t>(n);
  }
  out.resize(static_cast<size_t>(at));
  return out;
}

StatusOr<std::string> RegularFile::ReadPrefix(size_t n) const { return ReadUpTo(n); }

StatusOr<std::string> RegularFile::ReadAll() const {
  // One byte past the limit tells a file that grew too large from one that
  // ends exactly at it.
  const uint64_t limit = max_bytes_ == UINT64_MAX ? max_bytes_ : max_bytes_ + 1;
  CKPT_ASSIGN_OR_RETURN(std::string bytes, ReadUpTo(limit));
  if (bytes.size() > max_bytes_) {
    return Status::InvalidArgument(what_ + " '" + path_ + "' grew past the limit of " +
                                   std::to_string(max_bytes_) + " bytes while it was read");
  }
  return bytes;
}

StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes,
                                      std::string_view what) {
  CKPT_ASSIGN_OR_RETURN(RegularFile file, RegularFile::Open(path, max_bytes, what));
  return file.ReadAll();
}

}  // namespace ckpt::format
