#include "liveness.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

namespace ckpt::ipc::internal {
namespace {

// The largest pid Linux hands out (PID_MAX_LIMIT on 64-bit).
constexpr uint64_t kMaxPid = uint64_t{1} << 22;

// Reads up to `cap` bytes of a /proc file. False when it cannot be opened.
bool ReadProcFile(const char* path, std::string* out, size_t cap) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->resize(cap);
  size_t got = 0;
  while (got < cap) {
    ssize_t n = ::read(fd, out->data() + got, cap - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out->resize(got);
  return got > 0;
}

struct ProcStat {
  char state = '?';
  uint64_t start_time = 0;
};

// Parses /proc/PID/stat: "pid (comm) state ppid ... starttime ...". comm may
// hold spaces and parentheses, so fields are counted from the last ')'.
bool ParseProcStat(std::string_view text, ProcStat* out) {
  size_t close = text.rfind(')');
  if (close == std::string_view::npos || close + 2 >= text.size()) return false;
  std::string_view rest = text.substr(close + 2);  // starts at field 3
  int field = 3;
  size_t pos = 0;
  while (pos < rest.size()) {
    size_t end = rest.find(' ', pos);
    if (end == std::string_view::npos) end = rest.size();
    std::string_view tok = rest.substr(pos, end - pos);
    if (field == 3) {
      if (tok.empty()) return false;
      out->state = tok[0];
    } else if (field == 22) {
      uint64_t v = 0;
      if (tok.empty()) return false;
      for (char c : tok) {
        if (c < '0' || c > '9') return false;
        v = v * 10 + static_cast<uint64_t>(c - '0');
      }
      out->start_time = v;
      return true;
    }
    ++field;
    pos = end + 1;
  }
  return false;
}

bool ReadProcStat(uint64_t pid, ProcStat* out) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  std::string text;
  if (!ReadProcFile(path.c_str(), &text, 4096)) return false;
  return ParseProcStat(text, out);
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

struct BootIdCache {
  Status status;
  uint8_t bytes[16] = {};
};

BootIdCache LoadBootId() {
  BootIdCache cache;
  std::string text;
  if (!ReadProcFile("/proc/sys/kernel/random/boot_id", &text, 64)) {
    cache.status = Status::IOError("cannot read /proc/sys/kernel/random/boot_id");
    return cache;
  }
  int nibbles = 0;
  for (char c : text) {
    if (c == '-' || c == '\n') continue;
    int d = HexDigit(c);
    if (d < 0 || nibbles >= 32) {
      cache.status = Status::IOError("unexpected boot id '" + text + "'");
      return cache;
    }
    cache.bytes[nibbles / 2] =
        static_cast<uint8_t>(cache.bytes[nibbles / 2] | (d << (nibbles % 2 ? 0 : 4)));
    ++nibbles;
  }
  if (nibbles != 32) cache.status = Status::IOError("unexpected boot id '" + text + "'");
  return cache;
}

}  // namespace

StatusOr<const uint8_t*> BootId() {
  static const BootIdCache cache = LoadBootId();
  if (!cache.status.ok()) return cache.status;
  return static_cast<const uint8_t*>(cache.bytes);
}

StatusOr<ProcessIdentity> SelfIdentity() {
  ProcessIdentity id;
  id.pid = static_cast<uint64_t>(::getpid());
  ProcStat stat;
  if (!ReadProcStat(id.pid, &stat)) {
    return Status::IOError("cannot read /proc/" + std::to_string(id.pid) + "/stat");
  }
  id.start_time = stat.start_time;
  CKPT_ASSIGN_OR_RETURN(const uint8_t* boot, BootId());
  std::memcpy(id.boot_id, boot, sizeof(id.boot_id));
  return id;
}

bool ProcessAlive(const ProcessIdentity& id, std::string* why) {
  if (id.pid == 0 || id.pid > kMaxPid) {
    *why = "pid " + std::to_string(id.pid) + " is not a valid pid";
    return false;
  }
  auto boot = BootId();
  if (boot.ok() && std::memcmp(*boot, id.boot_id, sizeof(id.boot_id)) != 0) {
    *why = "pid " + std::to_string(id.pid) + " ran before the last reboot";
    return false;
  }
  ProcStat stat;
  if (!ReadProcStat(id.pid, &stat)) {
    *why = "pid " + std::to_string(id.pid) + " has exited";
    return false;
  }
  if (stat.start_time != id.start_time) {
    *why = "pid " + std::to_string(id.pid) + " has exited (the pid now names another process)";
    return false;
  }
  if (stat.state == 'Z' || stat.state == 'X' || stat.state == 'x') {
    *why = "pid " + std::to_string(id.pid) + " has exited (zombie)";
    return false;
  }
  return true;
}

}  // namespace ckpt::ipc::internal
