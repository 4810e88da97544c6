#include "ckpt/format/regular_file.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

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

constexpr int kFileFlags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;

// RegularFile::Resolver::kWalk: `relative` opened one component at a time
// beneath `dir_fd`, none of them a symbolic link (checked, then opened with
// O_NOFOLLOW, so a link swapped in between fails the open), "." and ".."
// refused. Returns the file's descriptor, or -1 with `*err` set (ELOOP for a
// link, EXDEV for "." or "..", the open's errno otherwise).
int WalkBeneath(int dir_fd, const std::string& relative, int* err) {
  std::vector<std::string> parts;
  size_t at = 0;
  while (at <= relative.size()) {
    const size_t slash = std::min(relative.find('/', at), relative.size());
    if (slash > at) parts.push_back(relative.substr(at, slash - at));
    at = slash + 1;
  }
  if (parts.empty()) {
    *err = ENOENT;
    return -1;
  }
  int cur = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  for (size_t i = 0; cur >= 0 && i < parts.size(); ++i) {
    const std::string& part = parts[i];
    struct stat st;
    int next = -1;
    if (part == "." || part == "..") {
      *err = EXDEV;
    } else if (::fstatat(cur, part.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      *err = errno;
    } else if (S_ISLNK(st.st_mode)) {
      *err = ELOOP;
    } else {
      const bool last = i + 1 == parts.size();
      next = ::openat(cur, part.c_str(),
                      last ? kFileFlags : (O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (next < 0) *err = errno == ENOTDIR && !last ? ELOOP : errno;
    }
    ::close(cur);
    cur = next;
  }
  return cur;
}

}  // namespace

StatusOr<RegularFile> RegularFile::Open(const std::string& path, uint64_t max_bytes,
                                        std::string_view what) {
  const std::string named = std::string(what) + " '" + path + "'";
  int fd;
  do {
    fd = ::open(path.c_str(), kFileFlags);
  } while (fd < 0 && errno == EINTR);
  return Checked(fd, fd < 0 ? errno : 0, path, named, max_bytes, what);
}

StatusOr<RegularFile> RegularFile::OpenBeneath(const std::string& dir, const std::string& relative,
                                               uint64_t max_bytes, std::string_view what,
                                               Resolver resolver) {
  const std::string named = std::string(what) + " '" + relative + "' beneath " + dir;
  if (relative.empty() || relative[0] == '/') {
    return Status::InvalidArgument(named + ": not a relative path");
  }
  const int dir_fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(named + ": no directory " + dir);
    return Status::IOError(named + ": cannot open the directory: " + std::strerror(err));
  }
  int fd = -1;
  int err = ENOSYS;
  if (resolver == Resolver::kOpenat2) {
    open_how how{};
    how.flags = kFileFlags;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    do {
      fd = static_cast<int>(::syscall(SYS_openat2, dir_fd, relative.c_str(), &how, sizeof how));
    } while (fd < 0 && errno == EINTR);
    err = fd < 0 ? errno : 0;
  }
  if (fd < 0 && err == ENOSYS) {
    fd = WalkBeneath(dir_fd, relative, &err);
  }
  ::close(dir_fd);
  if (fd < 0 && err == ELOOP) {
    return Status::InvalidArgument(named +
                                   " is reached through a symbolic link (refused: name "
                                   "the file itself, with no link on the way)");
  }
  if (fd < 0 && err == EXDEV) {
    return Status::InvalidArgument(named + " leads out of " + dir + " (refused)");
  }
  return Checked(fd, err, dir + "/" + relative, named, max_bytes, what);
}

StatusOr<RegularFile> RegularFile::Checked(int fd, int open_errno, const std::string& path,
                                           const std::string& named, uint64_t max_bytes,
                                           std::string_view what) {
  if (fd < 0) {
    const int err = open_errno;
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

Status RegularFile::ReadInPieces(const std::function<void(std::string_view)>& sink) const {
  std::string piece(static_cast<size_t>(std::min<uint64_t>(size_, uint64_t{1} << 20)), '\0');
  if (piece.empty()) piece.resize(4096);
  uint64_t at = 0;
  while (true) {
    const ssize_t n = ::pread(fd_, piece.data(), piece.size(), static_cast<off_t>(at));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(what_ + " '" + path_ + "': read: " + std::strerror(errno));
    }
    if (n == 0) return Status::OK();
    at += static_cast<uint64_t>(n);
    if (at > max_bytes_) {
      return Status::InvalidArgument(what_ + " '" + path_ + "' grew past the limit of " +
                                     std::to_string(max_bytes_) + " bytes while it was read");
    }
    sink(std::string_view(piece.data(), static_cast<size_t>(n)));
  }
}

StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes,
                                      std::string_view what) {
  CKPT_ASSIGN_OR_RETURN(RegularFile file, RegularFile::Open(path, max_bytes, what));
  return file.ReadAll();
}

}  // namespace ckpt::format
