// The experiment's secret files (ckpt/ipc/tcp_channel.h): loaded only when
// private to this user, created private with random contents.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "ckpt/ipc/tcp_channel.h"
#include "hmac.h"

namespace ckpt::ipc {

StatusOr<std::string> LoadSecretFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return Status::NotFound("secret file " + path + " does not exist");
    return Status::IOError("secret file " + path + ": " + std::strerror(e));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::IOError("secret file " + path + ": " + std::strerror(e));
  }
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::FailedPrecondition("secret file " + path + " is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    return Status::FailedPrecondition("secret file " + path + " has mode " + mode +
                                      ": group or others may read or write it (chmod 600 it)");
  }
  if (st.st_uid != geteuid()) {
    ::close(fd);
    return Status::FailedPrecondition("secret file " + path + " (mode " + mode +
                                      ") is owned by uid " + std::to_string(st.st_uid) +
                                      ", not by this user (uid " + std::to_string(geteuid()) + ")");
  }
  std::string secret;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return Status::IOError("secret file " + path + ": " + std::strerror(e));
    }
    if (n == 0) break;
    secret.append(buf, static_cast<size_t>(n));
    if (secret.size() > (1u << 20)) {
      ::close(fd);
      return Status::FailedPrecondition("secret file " + path + " is larger than 1 MiB");
    }
  }
  ::close(fd);
  while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) {
    secret.pop_back();
  }
  if (secret.size() < kMinSecretBytes) {
    return Status::FailedPrecondition("secret file " + path + " (mode " + mode + ") holds " +
                                      std::to_string(secret.size()) + " bytes, fewer than " +
                                      std::to_string(kMinSecretBytes));
  }
  return secret;
}

Status CreateSecretFile(const std::string& path) {
  uint8_t raw[32];
  CKPT_RETURN_IF_ERROR(internal::RandomBytes(raw, sizeof(raw)));
  std::string text;
  static const char kHex[] = "0123456789abcdef";
  for (uint8_t b : raw) {
    text.push_back(kHex[b >> 4]);
    text.push_back(kHex[b & 15]);
  }
  text.push_back('\n');
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    const int e = errno;
    if (e == EEXIST) return Status::AlreadyExists("secret file " + path + " already exists");
    return Status::IOError("creating secret file " + path + ": " + std::strerror(e));
  }
  // The umask cannot widen 0600, but an fchmod makes it exact.
  (void)fchmod(fd, 0600);
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return Status::IOError("writing secret file " + path + ": " + std::strerror(e));
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    return Status::IOError("writing secret file " + path + ": " + std::strerror(errno));
  }
  return Status::OK();
}

}  // namespace ckpt::ipc
