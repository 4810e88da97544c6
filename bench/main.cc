#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include "bench.h"
#ifdef CKPT_BENCH_WITH_MODEL
#include "ckpt/worker/allocator.h"
#endif

namespace ckpt::bench {
namespace {

struct Entry {
  const char* help;
  BenchFn fn;
};

std::map<std::string, Entry>& Registry() {
  static std::map<std::string, Entry> registry;
  return registry;
}

}  // namespace

Registrar::Registrar(const char* name, const char* help, BenchFn fn) {
  Registry()[name] = Entry{help, fn};
}

std::string Args::Get(const std::string& key, const std::string& def) const {
  auto it = flags_.find(key);
  return it == flags_.end() ? def : it->second;
}

double Args::GetDouble(const std::string& key, double def) const {
  auto it = flags_.find(key);
  return it == flags_.end() ? def : std::strtod(it->second.c_str(), nullptr);
}

long long Args::GetInt(const std::string& key, long long def) const {
  auto it = flags_.find(key);
  return it == flags_.end() ? def
                            : static_cast<long long>(std::strtod(it->second.c_str(), nullptr));
}

long long PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

long long PeakRssChildrenBytes() {
  struct rusage ru;
  if (getrusage(RUSAGE_CHILDREN, &ru) != 0) return 0;
  return static_cast<long long>(ru.ru_maxrss) * 1024;
}

}  // namespace ckpt::bench

int main(int argc, char** argv) {
#ifdef CKPT_BENCH_WITH_MODEL
  // The allocator policy of ckpt-worker, so that the in-process loops measured
  // here (the bare loop, `train`) run as the worker does (allocator.h).
  ckpt::worker::TuneAllocatorForTraining();
#endif
  auto& registry = ckpt::bench::Registry();
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || registry.count(argv[1]) == 0) {
    std::fprintf(stderr, "usage: ckpt-bench NAME [--flag value ...]\n\nbenchmarks:\n");
    for (const auto& [name, e] : registry)
      std::fprintf(stderr, "  %-12s %s\n", name.c_str(), e.help);
    return argc < 2 ? 2 : (std::strcmp(argv[1], "--help") == 0 ? 0 : 2);
  }
  std::map<std::string, std::string> flags;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      std::fprintf(stderr, "ckpt-bench: unexpected argument '%s'\n", a.c_str());
      return 2;
    }
    a = a.substr(2);
    auto eq = a.find('=');
    if (eq != std::string::npos) {
      flags[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
      flags[a] = argv[++i];
    } else {
      flags[a] = "1";
    }
  }
  return registry[argv[1]].fn(ckpt::bench::Args(flags));
}
