// The BLAS kernels of the process, from OpenBLAS's own API (no LibTorch).
#include "ckpt/model/blas_kernels.h"

#include <dlfcn.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "ckpt/base/cpu_features.h"

namespace ckpt::model {
namespace {

// OpenBLAS's core names (driver/others/dynamic.c) whose kernels use AVX2 or
// AVX-512.
constexpr std::array<std::string_view, 6> kAvx2Cores = {"Haswell",  "Excavator",  "Zen",
                                                        "SkylakeX", "Cooperlake", "SapphireRapids"};

// The name the process started with (its comm, as `ps`, `top`, `pkill` and
// systemd show it), carried across the exec: a program executed as
// /proc/self/exe is named "exe".
constexpr const char* kNameVariable = "CKPT_BLAS_STARTED_AS";

// An OpenBLAS entry point `char* name(void)`, when OpenBLAS is loaded.
const char* CallOpenBlas(const char* name) {
  using Fn = char* (*)();
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): dlsym's void*
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
  return fn == nullptr ? nullptr : fn();
}

}  // namespace

std::string BetterBlasCore(std::string_view core, bool cpu_avx512, bool cpu_avx2_fma) {
  if (core.empty() || !cpu_avx2_fma) return "";
  for (std::string_view c : kAvx2Cores) {
    if (c == core) return "";
  }
  return cpu_avx512 ? "SkylakeX" : "Haswell";
}

BlasKernels DescribeBlasKernels() {
  BlasKernels b;
  const char* core = CallOpenBlas("openblas_get_corename");
  if (core == nullptr) return b;
  b.library = "OpenBLAS";
  b.core = core;
  const char* config = CallOpenBlas("openblas_get_config");
  if (config != nullptr) b.config = config;
  const base::CpuFeatures& cpu = base::CpuFeaturesOfThisHost();
  b.better_core = BetterBlasCore(b.core, cpu.Avx512Core(), cpu.Avx2Fma());
  return b;
}

std::string DescribeFallback(const BlasKernels& b) {
  if (b.better_core.empty()) return "";
  return "OpenBLAS (" + b.config + ") runs its " + b.core +
         " kernels, without AVX2, on a CPU with AVX2 and FMA: its matrix products run several "
         "times slower than with OPENBLAS_CORETYPE=" +
         b.better_core;
}

std::string UseTheCpusBlasKernels(char** argv) {
  if (const char* name = std::getenv(kNameVariable); name != nullptr) {
    // Started again below: the name it had, and nothing left for its children.
    prctl(PR_SET_NAME, name, 0, 0, 0);
    unsetenv(kNameVariable);
  }
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  const BlasKernels b = DescribeBlasKernels();
  if (b.better_core.empty()) return "";
  std::array<char, 17> name{};  // PR_GET_NAME writes up to 16 bytes, its NUL included
  if (prctl(PR_GET_NAME, name.data(), 0, 0, 0) != 0 ||
      setenv(kNameVariable, name.data(), /*overwrite=*/1) != 0 ||
      setenv("OPENBLAS_CORETYPE", b.better_core.c_str(), /*overwrite=*/1) != 0) {
    const int err = errno;
    unsetenv(kNameVariable);
    return std::string("preparing to start again with OPENBLAS_CORETYPE: ") + std::strerror(err);
  }
  execv("/proc/self/exe", argv);
  const int err = errno;
  unsetenv("OPENBLAS_CORETYPE");  // this process still runs b.core
  unsetenv(kNameVariable);
  return "executing /proc/self/exe with OPENBLAS_CORETYPE=" + b.better_core + ": " +
         std::strerror(err);
}

}  // namespace ckpt::model
