// eio_shim: an LD_PRELOAD library that makes a disk fail under a real
// process. Once the file CKPT_EIO_TRIGGER exists, every write or sync of a
// file under the directory CKPT_EIO_PATH (write, pwrite, writev, pwritev,
// fsync, fdatasync) fails with EIO, as a failing disk's would; other files,
// and everything before the trigger, go through untouched. For
// PbtRunTest.AStoreThatFailsForGood...: RocksDB's own writes fail, not a
// mock of them.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

// True when `fd` is a file under CKPT_EIO_PATH and the trigger exists.
// Leaves errno as it was.
static int Fails(int fd) {
  const char* prefix = getenv("CKPT_EIO_PATH");
  const char* trigger = getenv("CKPT_EIO_TRIGGER");
  if (prefix == NULL || trigger == NULL || prefix[0] == '\0') return 0;
  const int saved = errno;
  int hit = 0;
  if (access(trigger, F_OK) == 0) {
    char link[64];
    char path[PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof(path) - 1);
    if (n > 0) {
      path[n] = '\0';
      const size_t len = strlen(prefix);
      hit = strncmp(path, prefix, len) == 0 && (path[len] == '/' || path[len] == '\0');
    }
  }
  errno = saved;
  return hit;
}

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))
#define FAIL_IF_HIT(fd) \
  do {                  \
    if (Fails(fd)) {    \
      errno = EIO;      \
      return -1;        \
    }                   \
  } while (0)

ssize_t write(int fd, const void* buf, size_t n) {
  FAIL_IF_HIT(fd);
  return NEXT(write)(fd, buf, n);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  FAIL_IF_HIT(fd);
  return NEXT(pwrite)(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t off) {
  FAIL_IF_HIT(fd);
  return NEXT(pwrite64)(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec* iov, int count) {
  FAIL_IF_HIT(fd);
  return NEXT(writev)(fd, iov, count);
}

ssize_t pwritev(int fd, const struct iovec* iov, int count, off_t off) {
  FAIL_IF_HIT(fd);
  return NEXT(pwritev)(fd, iov, count, off);
}

int fsync(int fd) {
  FAIL_IF_HIT(fd);
  return NEXT(fsync)(fd);
}

int fdatasync(int fd) {
  FAIL_IF_HIT(fd);
  return NEXT(fdatasync)(fd);
}
