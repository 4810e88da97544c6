#include "ckpt/base/cpu_features.h"

#include <string>

namespace ckpt::base {
namespace {

CpuFeatures Probe() {
  __builtin_cpu_init();
  CpuFeatures f;
  f.avx2 = __builtin_cpu_supports("avx2") != 0;
  f.fma = __builtin_cpu_supports("fma") != 0;
  f.avx512f = __builtin_cpu_supports("avx512f") != 0;
  f.avx512bw = __builtin_cpu_supports("avx512bw") != 0;
  f.avx512vl = __builtin_cpu_supports("avx512vl") != 0;
  f.avx512dq = __builtin_cpu_supports("avx512dq") != 0;
  f.avx512cd = __builtin_cpu_supports("avx512cd") != 0;
  return f;
}

}  // namespace

std::string CpuFeatures::Names() const {
  std::string out;
  auto add = [&out](bool present, const char* name) {
    if (!present) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512cd, "avx512cd");
  return out.empty() ? "none" : out;
}

const CpuFeatures& CpuFeaturesOfThisHost() {
  static const CpuFeatures features = Probe();
  return features;
}

}  // namespace ckpt::base
