#include "trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "log.h"

namespace ckpt::scheduler::trace {
namespace {

using json = nlohmann::json;

// The trace file's descriptor, or -1 (no CKPT_TRACE_FILE, or it failed to
// open: said once in the log).
int Fd() {
  static const int fd = [] {
    const char* path = std::getenv(kEnv);
    if (path == nullptr || *path == '\0') return -1;
    const int f = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (f < 0) Logger().error("{}={}: cannot open: {}", kEnv, path, std::strerror(errno));
    return f;
  }();
  return fd;
}

void Emit(const char* ev, json fields) {
  const int fd = Fd();
  if (fd < 0) return;
  fields["ev"] = ev;
  fields["pid"] = static_cast<int64_t>(::getpid());
  fields["unix_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const std::string line = fields.dump() + "\n";
  // One write: O_APPEND keeps lines from several threads whole.
  ssize_t n;
  do {
    n = ::write(fd, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
}

}  // namespace

bool Enabled() { return Fd() >= 0; }

void Result(int worker, uint64_t task) {
  if (Enabled()) Emit(kResult, {{"worker", worker}, {"task", task}});
}

void Committed(const std::string& exp, const std::string& member, int64_t version, int interval,
               const std::string& blob_hex) {
  if (!Enabled()) return;
  Emit(kCommitted, {{"exp", exp},
                    {"member", member},
                    {"version", version},
                    {"interval", interval},
                    {"blob", blob_hex}});
}

void Exploited(const std::string& exp, const std::string& member, const std::string& donor,
               int64_t version) {
  if (!Enabled()) return;
  Emit(kExploited, {{"exp", exp}, {"member", member}, {"donor", donor}, {"version", version}});
}

void Hello(int worker, const std::string& device) {
  if (Enabled()) Emit(kHello, {{"worker", worker}, {"device", device}});
}

void Lost(int worker, const std::string& reason) {
  if (Enabled()) Emit(kLost, {{"worker", worker}, {"reason", reason}});
}

void StoreFull() {
  if (Enabled()) Emit(kStoreFull, json::object());
}

void StoreWritable() {
  if (Enabled()) Emit(kStoreWritable, json::object());
}

}  // namespace ckpt::scheduler::trace
