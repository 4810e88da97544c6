// ckpt-bench: named benchmarks, each printing what it measured and, as its last
// line, one JSON object. A benchmark asserts nothing about time.
//
//   build/bench/ckpt-bench NAME [--flag value ...]
//
// Each benchmark file registers itself with CKPT_BENCHMARK(name, function).
#ifndef CKPT_BENCH_BENCH_H_
#define CKPT_BENCH_BENCH_H_

#include <map>
#include <string>
#include <vector>

namespace ckpt::bench {

// Flags given after NAME: "--state-bytes 25000000" -> {"state-bytes": "25000000"};
// a bare "--flag" maps to "1".
class Args {
 public:
  Args(std::map<std::string, std::string> flags) : flags_(std::move(flags)) {}
  std::string Get(const std::string& key, const std::string& def) const;
  double GetDouble(const std::string& key, double def) const;
  long long GetInt(const std::string& key, long long def) const;
  bool Has(const std::string& key) const { return flags_.count(key) > 0; }
  const std::map<std::string, std::string>& flags() const { return flags_; }

 private:
  std::map<std::string, std::string> flags_;
};

using BenchFn = int (*)(const Args& args);

struct Registrar {
  Registrar(const char* name, const char* help, BenchFn fn);
};

// Peak resident set size of this process (VmHWM), in bytes.
long long PeakRssBytes();
// Peak RSS of waited-for children (getrusage RUSAGE_CHILDREN), in bytes.
long long PeakRssChildrenBytes();

}  // namespace ckpt::bench

#define CKPT_BENCHMARK(name, help, fn) \
  static ::ckpt::bench::Registrar ckpt_bench_registrar_##fn(name, help, fn)

#endif  // CKPT_BENCH_BENCH_H_
