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

// Every argument after NAME, passed on as given.
int MetricsExec(const std::vector<std::string>& args) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string binary = (self.parent_path() / "ckpt-bench-metrics").string();
  if (ec || access(binary.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "ckpt-bench metrics: %s is not built\n", binary.c_str());
    return 1;
  }
  std::vector<std::string> argv = {binary, "metrics"};
  argv.insert(argv.end(), args.begin(), args.end());
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

// The flags, --help included, are ckpt-bench-metrics's: all are passed on.
BenchRun MetricsExecFlags(CLI::App& cmd) {
  cmd.prefix_command();
  cmd.set_help_flag();
  return [&cmd] { return MetricsExec(cmd.remaining()); };
}

}  // namespace

CKPT_BENCHMARK("metrics", "ckpt::metrics: hot-path update cost, scrape time, pipeline on vs off",
               MetricsExecFlags);

}  // namespace ckpt::bench
