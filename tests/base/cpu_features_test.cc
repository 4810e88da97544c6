// ckpt::base::CpuFeaturesOfThisHost against the kernel's own view of the CPU
// (/proc/cpuinfo's flags), and the derived predicates.
#include "ckpt/base/cpu_features.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace ckpt::base {
namespace {

std::set<std::string> ProcCpuinfoFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(CpuFeaturesTest, AgreesWithTheKernelsFlags) {
  const std::set<std::string> flags = ProcCpuinfoFlags();
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  const CpuFeatures& f = CpuFeaturesOfThisHost();
  EXPECT_EQ(f.avx2, flags.count("avx2") == 1);
  EXPECT_EQ(f.fma, flags.count("fma") == 1);
  EXPECT_EQ(f.avx512f, flags.count("avx512f") == 1);
  EXPECT_EQ(f.avx512bw, flags.count("avx512bw") == 1);
  EXPECT_EQ(f.avx512vl, flags.count("avx512vl") == 1);
  EXPECT_EQ(f.avx512dq, flags.count("avx512dq") == 1);
  EXPECT_EQ(f.avx512cd, flags.count("avx512cd") == 1);
  EXPECT_EQ(&f, &CpuFeaturesOfThisHost()) << "probed once";
}

TEST(CpuFeaturesTest, PredicatesNeedEveryPart) {
  CpuFeatures f;
  EXPECT_EQ(f.Names(), "none");
  f.avx2 = true;
  EXPECT_FALSE(f.Avx2Fma());
  f.fma = true;
  EXPECT_TRUE(f.Avx2Fma());
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = true;
  EXPECT_FALSE(f.Avx512Core()) << "CD missing";
  f.avx512cd = true;
  EXPECT_TRUE(f.Avx512Core());
  EXPECT_EQ(f.Names(), "avx2 fma avx512f avx512bw avx512vl avx512dq avx512cd");
}

}  // namespace
}  // namespace ckpt::base
