#include "ckpt/logging/trace_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ckpt/logging/logging.h"

namespace ckpt::logging {
namespace {

// The trace file's descriptor, or -1 (no CKPT_TRACE_FILE, or it failed to
// open).
int Fd() {
  static const int fd = [] {
    const char* path = std::getenv(kTraceFileVariable);
    if (path == nullptr || *path == '\0') return -1;
    const int f = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (f < 0) {
      Logger().error("{}={}: cannot open: {}", kTraceFileVariable, path, std::strerror(errno));
    }
    return f;
  }();
  return fd;
}

}  // namespace

bool TraceEnabled() { return Fd() >= 0; }

void EmitTrace(const char* ev, nlohmann::json fields) {
  const int fd = Fd();
  if (fd < 0) return;
  fields["ev"] = ev;
  fields["pid"] = static_cast<int64_t>(::getpid());
  fields["unix_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const std::string line = fields.dump() + "\n";
  // One write: O_APPEND keeps lines from several threads and processes whole.
  ssize_t n;
  do {
    n = ::write(fd, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
}

}  // namespace ckpt::logging
