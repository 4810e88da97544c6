#include "process_sampler.h"

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace ckpt::metrics {
namespace {

// Fields of /proc/PID/stat after the command, which sits in parentheses and may
// itself hold spaces and parentheses: the last ')' ends it. tokens[0] is field 3.
constexpr size_t kState = 3 - 3;
constexpr size_t kUtime = 14 - 3;
constexpr size_t kStime = 15 - 3;
constexpr size_t kStartTime = 22 - 3;
constexpr size_t kRss = 24 - 3;

bool ParseU64(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

}  // namespace

StatusOr<ProcessSample> SampleProcess(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": no such process");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return Status::Corruption(path + ": no ')' after the command");
  std::istringstream fields(text.substr(close + 1));
  std::vector<std::string> tokens{std::istream_iterator<std::string>(fields),
                                  std::istream_iterator<std::string>()};
  if (tokens.size() <= kRss) return Status::Corruption(path + ": too few fields");
  if (tokens[kState] == "Z" || tokens[kState] == "X") return Status::NotFound(path + ": zombie");
  uint64_t utime = 0, stime = 0, start = 0, rss_pages = 0;
  if (!ParseU64(tokens[kUtime], &utime) || !ParseU64(tokens[kStime], &stime) ||
      !ParseU64(tokens[kStartTime], &start) || !ParseU64(tokens[kRss], &rss_pages)) {
    return Status::Corruption(path + ": a time or size field is not a number");
  }
  static const long ticks_per_s = sysconf(_SC_CLK_TCK);
  static const long page_bytes = sysconf(_SC_PAGESIZE);
  ProcessSample s;
  s.cpu_seconds = static_cast<double>(utime + stime) / static_cast<double>(ticks_per_s);
  s.resident_bytes = static_cast<int64_t>(rss_pages) * page_bytes;
  s.start_ticks = start;
  return s;
}

StatusOr<ProcessSample> SampleProcessStartedAt(pid_t pid, uint64_t start_ticks) {
  CKPT_ASSIGN_OR_RETURN(ProcessSample s, SampleProcess(pid));
  if (s.start_ticks != start_ticks) {
    return Status::NotFound("pid " + std::to_string(pid) + " now belongs to another process");
  }
  return s;
}

int HostCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

}  // namespace ckpt::metrics
