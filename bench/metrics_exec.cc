// `ckpt-bench metrics` in the main ckpt-bench binary: runs ckpt-bench-metrics
// (built beside it, without LibTorch; see bench/CMakeLists.txt for why) with
// the same flags, and passes its output and exit status through.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench.h"

namespace ckpt::bench {
namespace {

int MetricsExec(const Args& args) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string binary = (self.parent_path() / "ckpt-bench-metrics").string();
  if (ec || access(binary.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "ckpt-bench metrics: %s is not built\n", binary.c_str());
    return 1;
  }
  std::vector<std::string> argv = {binary, "metrics"};
  for (const auto& [key, value] : args.flags()) {
    argv.push_back("--" + key);
    if (value != "1") argv.push_back(value);
  }
  std::vector<char*> raw;
  for (auto& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    execv(raw[0], raw.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

CKPT_BENCHMARK("metrics", "ckpt::metrics: hot-path update cost, scrape time, pipeline on vs off",
               MetricsExec);

}  // namespace ckpt::bench
