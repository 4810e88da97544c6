// BlasKernels: the OpenBLAS kernels a process runs, the rule that flags a
// fallback without AVX2 on a CPU that has it, and ckpt-worker starting again
// with the CPU's kernels (blas_kernels.h). The reports come from ckpt-worker
// --blas-kernels, run with OPENBLAS_CORETYPE unset and set to a fallback, so
// the test holds on every CPU, known to OpenBLAS or not.
#include "ckpt/model/blas_kernels.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <sstream>
#include <string>

namespace ckpt::model {
namespace {

TEST(BlasKernelsTest, AFallbackWithoutAvx2IsFlaggedOnlyWhereTheCpuHasAvx2) {
  EXPECT_EQ(BetterBlasCore("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Prescott", false, true), "Haswell");
  EXPECT_EQ(BetterBlasCore("Sandybridge", false, true), "Haswell");
  EXPECT_EQ(BetterBlasCore("Prescott", false, false), "");  // nothing better to run
  for (const char* core : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"}) {
    EXPECT_EQ(BetterBlasCore(core, true, true), "") << core;
  }
  EXPECT_EQ(BetterBlasCore("", true, true), "");  // not OpenBLAS
}

struct Report {
  std::string library, core, better_core;
};

// ckpt-worker's report, run with OPENBLAS_CORETYPE=`coretype` (unset when
// empty).
Report RunWorker(const std::string& coretype) {
  const std::string env =
      coretype.empty() ? "env -u OPENBLAS_CORETYPE" : "env OPENBLAS_CORETYPE=" + coretype;
  const std::string cmd = env + " '" + std::string(CKPT_WORKER_BIN) + "' --blas-kernels";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr) << cmd;
  std::string out;
  std::array<char, 512> buf{};
  while (p != nullptr && std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  EXPECT_EQ(p == nullptr ? -1 : pclose(p), 0) << cmd;
  Report r;
  std::istringstream in(out);
  std::getline(in, r.library, '\t');
  std::getline(in, r.core, '\t');
  std::getline(in, r.better_core, '\n');
  return r;
}

TEST(BlasKernelsTest, TheWorkerRunsTheCpusKernelsUnlessToldOtherwise) {
  const bool avx2_fma = __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
  const Report own = RunWorker("");
  const Report sse3 = RunWorker("Prescott");
  // This process reads the same library as the worker (it is not executed
  // again: it runs what OpenBLAS picked).
  EXPECT_EQ(DescribeBlasKernels().library, own.library);
  if (own.library.empty()) {
    // PyPI's LibTorch: MKL, not OpenBLAS; nothing to report or flag.
    EXPECT_EQ(sse3.library, "");
    EXPECT_EQ(sse3.core, "");
    EXPECT_EQ(sse3.better_core, "");
    return;
  }
  EXPECT_EQ(own.library, "OpenBLAS");
  EXPECT_FALSE(own.core.empty());
  // Left to itself the worker runs kernels for this CPU: OpenBLAS's pick, or
  // the better core it started again with where OpenBLAS fell back.
  EXPECT_EQ(own.better_core, "") << "ckpt-worker runs OpenBLAS's " << own.core << " kernels";
  // An OPENBLAS_CORETYPE set wins, and a fallback is flagged.
  EXPECT_EQ(sse3.library, "OpenBLAS");
  EXPECT_EQ(sse3.core, "Prescott");
  if (!avx2_fma) {
    EXPECT_EQ(sse3.better_core, "");
    return;
  }
  ASSERT_FALSE(sse3.better_core.empty()) << "Prescott's SSE3 kernels on a CPU with AVX2";
  // The kernels it names are the CPU's own: told to run them, nothing is flagged.
  const Report better = RunWorker(sse3.better_core);
  EXPECT_EQ(better.core, sse3.better_core);
  EXPECT_EQ(better.better_core, "");
}

}  // namespace
}  // namespace ckpt::model
