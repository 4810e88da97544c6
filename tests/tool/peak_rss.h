// The test process's peak resident set, for the tool tests that check memory
// follows a file and not what its header claims.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace ckpt::tool::test_support {

// The process's peak resident set (VmHWM of /proc/self/status), in bytes; -1
// when unread.
inline int64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

}  // namespace ckpt::tool::test_support
