// Which CPU kernels the BLAS under LibTorch's CPU matrix products runs: the
// linear layers, thnn_conv2d, and the float32 matrix product `ckpt-bench
// train` takes as the CPU's peak.
//
// Debian's LibTorch calls the system BLAS: OpenBLAS, which holds kernels for
// many CPUs and picks one set when the library loads (OPENBLAS_CORETYPE in
// the environment overrides the pick). On a CPU newer than its release it
// falls back to its SSE3 kernels ("Prescott"): Debian 12's OpenBLAS 0.3.21 on
// an Intel Xeon of family 6 model 207 (AVX-512) ran a float32 matrix product
// at 16-31 GFLOP/s on one thread, and at 119-154 with
// OPENBLAS_CORETYPE=SkylakeX; a plain LeNet-5 population trained 1.10-1.32x
// faster, the seed workload 1.35x (bench/RESULTS.md). The pick
// is made as the library loads, before main(): ckpt-worker and ckpt-bench
// start again (UseTheCpusBlasKernels) with OPENBLAS_CORETYPE naming the
// CPU's kernels when OpenBLAS fell back and nobody set it, and record the
// kernels they run. PyPI's LibTorch links MKL instead, which picks its
// kernels from the CPU's features.
//
// Thread-safety: DescribeBlasKernels and BetterBlasCore from any thread;
// UseTheCpusBlasKernels at the top of main, before any thread starts.
#ifndef CKPT_MODEL_BLAS_KERNELS_H_
#define CKPT_MODEL_BLAS_KERNELS_H_

#include <string>
#include <string_view>

namespace ckpt::model {

struct BlasKernels {
  // "OpenBLAS" when the process's BLAS is OpenBLAS; empty otherwise (MKL in
  // PyPI's LibTorch), and then the fields below are empty too.
  std::string library;
  // OpenBLAS's build (openblas_get_config: version and options).
  std::string config;
  // The kernels it runs (openblas_get_corename), e.g. "Haswell", "Prescott".
  std::string core;
  // Non-empty when `core` is a fallback without AVX2 on a CPU with AVX2 and
  // FMA: the OPENBLAS_CORETYPE this CPU runs ("SkylakeX" with AVX-512,
  // "Haswell" otherwise).
  std::string better_core;
};

// The process's BLAS kernels, read from OpenBLAS's own API when it is loaded.
BlasKernels DescribeBlasKernels();

// The warning for kernels that BlasKernels::better_core flags, one wording for
// every program: "OpenBLAS (CONFIG) runs its CORE kernels, without AVX2, on a
// CPU with AVX2 and FMA: its matrix products run several times slower than
// with OPENBLAS_CORETYPE=BETTER_CORE". Empty when nothing is flagged.
std::string DescribeFallback(const BlasKernels& b);

// When OpenBLAS runs a fallback without AVX2 on a CPU with AVX2 and FMA
// (BlasKernels::better_core) and OPENBLAS_CORETYPE is not set, sets it to the
// CPU's kernels and executes the program again (/proc/self/exe, the same
// argv, the same process id, the same process name: `ps`, `pkill` and
// systemd see the program's name, not "exe"), so that OpenBLAS picks again
// as it loads; otherwise returns at once. An OPENBLAS_CORETYPE already set wins, so a run
// that wants OpenBLAS's own pick sets it to that. Returns the exec's error
// when it fails (the process goes on with the kernels it has).
// REQUIRES: argv is main's, with argv[argc] == nullptr.
std::string UseTheCpusBlasKernels(char** argv);

// The rule behind BlasKernels::better_core, for an OpenBLAS core name and
// the CPU's features: empty when `core` uses AVX2 (or newer) kernels, when
// the CPU lacks AVX2 or FMA, or when `core` is empty.
std::string BetterBlasCore(std::string_view core, bool cpu_avx512, bool cpu_avx2_fma);

}  // namespace ckpt::model

#endif  // CKPT_MODEL_BLAS_KERNELS_H_
