// BlasKernels: the OpenBLAS kernels a process runs, the rule that flags a
// fallback without AVX2 on a CPU that has it, and ckpt-worker starting again
// with the CPU's kernels (blas_kernels.h). The reports come from ckpt-worker
// --blas-kernels, run with OPENBLAS_CORETYPE unset and set to a fallback, so
// the test holds on every CPU, known to OpenBLAS or not.
#include "ckpt/model/blas_kernels.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

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

TEST(BlasKernelsTest, TheFallbackWarningNamesTheKernelsAndTheVariable) {
  BlasKernels b;
  b.library = "OpenBLAS";
  b.config = "OpenBLAS 0.3.21 DYNAMIC_ARCH";
  b.core = "Prescott";
  EXPECT_EQ(DescribeFallback(b), "");  // nothing flagged
  b.better_core = "SkylakeX";
  EXPECT_EQ(DescribeFallback(b),
            "OpenBLAS (OpenBLAS 0.3.21 DYNAMIC_ARCH) runs its Prescott kernels, without AVX2, on a "
            "CPU with AVX2 and FMA: its matrix products run several times slower than with "
            "OPENBLAS_CORETYPE=SkylakeX");
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

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A worker that starts again keeps the name it started with: `ps`, `pkill
// ckpt-worker` and systemd see "ckpt-worker", not the "exe" of
// /proc/self/exe. It runs with OPENBLAS_CORETYPE unset (it starts again on a
// CPU whose OpenBLAS falls back) and waits for a scheduler that is not there,
// which it says once its main is under way; then its name is read.
TEST(BlasKernelsTest, AWorkerThatStartsAgainKeepsItsName) {
  char dir_template[] = "/tmp/ckpt-blas-name-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string secret = dir + "/secret", log = dir + "/worker.log";
  { std::ofstream(secret) << std::string(48, 's'); }
  ASSERT_EQ(chmod(secret.c_str(), 0600), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    unsetenv("OPENBLAS_CORETYPE");
    FILE* out = std::freopen(log.c_str(), "w", stderr);
    if (out == nullptr) _exit(126);
    execl(CKPT_WORKER_BIN, CKPT_WORKER_BIN, "--connect", "127.0.0.1:1", "--secret-file",
          secret.c_str(), "--connect-timeout-s", "60", static_cast<char*>(nullptr));
    _exit(127);
  }
  const std::string proc = "/proc/" + std::to_string(pid);
  bool waiting = false;
  for (int i = 0; i < 1200 && !waiting; ++i) {  // up to 60 s
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    waiting = ReadFile(log).find("retrying") != std::string::npos;
  }
  const std::string name = ReadFile(proc + "/comm");
  const bool started_again =
      ReadFile(proc + "/environ").find("OPENBLAS_CORETYPE=") != std::string::npos;
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(waiting) << ReadFile(log);
  EXPECT_EQ(name, "ckpt-worker\n") << (started_again ? "started again" : "not started again");
  std::remove(secret.c_str());
  std::remove(log.c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace ckpt::model
