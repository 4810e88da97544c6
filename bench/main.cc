#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"
#ifdef CKPT_BENCH_WITH_STORE
#include "ckpt/store/store.h"
#endif
#ifdef CKPT_BENCH_WITH_MODEL
#include "ckpt/model/blas_kernels.h"
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

void PrintJsonLine(const nlohmann::json& out) {
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
}

long long PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

long long PeakRssChildrenBytes() {
  struct rusage ru;
  if (getrusage(RUSAGE_CHILDREN, &ru) != 0) return 0;
  return static_cast<long long>(ru.ru_maxrss) * 1024;
}

nlohmann::json CpuDescription() {
  static const char* const kSimd[] = {
      "sse4_2",      "avx",         "avx2",        "fma",      "avx512f",  "avx512bw", "avx512vl",
      "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni"};
  std::ifstream in("/proc/cpuinfo");
  std::map<std::string, std::string> first;  // the first processor's fields
  int logical = 0;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    std::string value = colon + 1 < line.size() ? line.substr(colon + 1) : "";
    value.erase(0, value.find_first_not_of(' '));
    if (key == "processor") ++logical;
    if (logical == 1) first.emplace(key, value);
  }
  nlohmann::json simd = nlohmann::json::array();
  const std::string flags = " " + first["flags"] + " ";
  for (const char* f : kSimd) {
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) simd.push_back(f);
  }
  nlohmann::json cpu = {{"model_name", first["model name"]},
                        {"vendor", first["vendor_id"]},
                        {"family", first["cpu family"]},
                        {"model", first["model"]},
                        {"logical_cpus", logical},
                        {"cores_per_socket", first["cpu cores"]},
                        {"simd", simd}};
#ifdef CKPT_BENCH_WITH_STORE
  // The code behind the CRC32C of every RocksDB record this process writes.
  cpu["crc32c"] = ckpt::store::Crc32cImplementation();
#endif
#ifdef CKPT_BENCH_WITH_MODEL
  // The kernels of LibTorch's CPU matrix products (OpenBLAS picks them when it
  // loads, unless OPENBLAS_CORETYPE names them: blas_kernels.h).
  const auto blas = ckpt::model::DescribeBlasKernels();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  cpu["blas"] = {{"library", blas.library.empty() ? "not OpenBLAS" : blas.library},
                 {"config", blas.config},
                 {"core", blas.core},
                 {"openblas_coretype", coretype == nullptr ? "" : coretype},
                 {"better_core", blas.better_core}};
  // The malloc this process runs, as ckpt-worker does: glibc's, or jemalloc
  // where LD_PRELOAD brings it (allocator.h).
  cpu["malloc"] = ckpt::worker::MallocName();
  if (!blas.better_core.empty()) {
    std::fprintf(stderr,
                 "ckpt-bench: %s (the figures measured here, the peak among them, are "
                 "understated)\n",
                 ckpt::model::DescribeFallback(blas).c_str());
  }
#endif
  return cpu;
}

}  // namespace ckpt::bench

int main(int argc, char** argv) {
#ifdef CKPT_BENCH_WITH_MODEL
  // The BLAS kernels ckpt-worker runs (blas_kernels.h), for the in-process
  // loops and the peak measured here and for the processes started (the
  // Python pool inherits OPENBLAS_CORETYPE): may execute ckpt-bench again.
  if (const std::string e = ckpt::model::UseTheCpusBlasKernels(argv); !e.empty()) {
    std::fprintf(stderr, "ckpt-bench: %s\n", e.c_str());
  }
  // The allocator policy of ckpt-worker, so that the in-process loops measured
  // here (the bare loop, `train`) run as the worker does (allocator.h).
  ckpt::worker::TuneAllocatorForTraining();
#endif
  CLI::App app{
      "ckpt-bench: named benchmarks, each printing what it measured and, last, one JSON line"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, ckpt::bench::BenchRun>> runs;
  for (const auto& [name, e] : ckpt::bench::Registry()) {
    CLI::App* cmd = app.add_subcommand(name, e.help);
    runs.emplace_back(cmd, e.fn(*cmd));
  }
  CLI11_PARSE(app, argc, argv);
  for (const auto& [cmd, run] : runs) {
    if (cmd->parsed()) return run();
  }
  return 2;
}
