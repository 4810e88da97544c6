// ckpt-bench: named benchmarks, each printing what it measured and, as its last
// line, one JSON object. A benchmark asserts nothing about time.
//
//   build/bench/ckpt-bench NAME [--flag value ...]    (NAME --help: its flags)
//
// Each benchmark file registers itself with CKPT_BENCHMARK(name, help, fn):
// `fn` declares the benchmark's flags on its CLI11 subcommand, bound to an
// options struct it owns, and returns the run, which main() calls once the
// command line parsed (a flag that does not parse, or is out of range, is
// refused by CLI11 naming it, before anything runs).
#ifndef CKPT_BENCH_BENCH_H_
#define CKPT_BENCH_BENCH_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

namespace ckpt::bench {

// Runs a benchmark whose flags are parsed; returns the exit status.
using BenchRun = std::function<int()>;
// Declares a benchmark's flags on `cmd` and returns its run.
using BenchFn = BenchRun (*)(CLI::App& cmd);

struct Registrar {
  Registrar(const char* name, const char* help, BenchFn fn);
};

// Prints `out` as the benchmark's last line on stdout (one JSON object).
void PrintJsonLine(const nlohmann::json& out);

// Peak resident set size of this process (VmHWM), in bytes.
long long PeakRssBytes();
// Peak RSS of waited-for children (getrusage RUSAGE_CHILDREN), in bytes.
long long PeakRssChildrenBytes();

// The median of `v` (the mean of the middle two for an even count); NaN when
// `v` is empty.
double Median(std::vector<double> v);

// The CPU the figures were measured on, from /proc/cpuinfo as lscpu shows
// it: {"model_name", "vendor", "family", "model", "logical_cpus",
// "cores_per_socket", "simd": [the SIMD flags among avx2, fma, avx512f,
// avx512bw, avx512vl, avx512_vnni, avx512_bf16, amx_tile, amx_bf16, ...]},
// and where the benchmark trains: "blas" (LibTorch's OpenBLAS and the kernels
// it runs) and "malloc" ("jemalloc 5.3.0-..." or "glibc 2.36"), and where it
// commits to the store: "crc32c" ("isa-l" or "rocksdb": store.h).
nlohmann::json CpuDescription();

}  // namespace ckpt::bench

#define CKPT_BENCHMARK(name, help, fn) \
  static ::ckpt::bench::Registrar ckpt_bench_registrar_##fn(name, help, fn)

#endif  // CKPT_BENCH_BENCH_H_
