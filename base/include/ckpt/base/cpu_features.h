// The host CPU's instruction-set extensions that ckpt's own kernels choose
// between (the worker's convolution, pooling and BLAS-core choices, the ring
// payload checksum): one probe for the whole process instead of one per
// kernel file, so that every kernel agrees on what the CPU has.
//
// The probe asks the compiler's runtime (__builtin_cpu_supports), which
// checks both CPUID and that the OS saves the wider registers (XGETBV).
//
// Thread-safety: CpuFeaturesOfThisHost() probes once (a function-local
// static) and returns a reference to an immutable value; safe from any thread.
#ifndef CKPT_BASE_CPU_FEATURES_H_
#define CKPT_BASE_CPU_FEATURES_H_

#include <string>

namespace ckpt::base {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512cd = false;

  // AVX2 with FMA: the 256-bit kernels' requirement.
  [[nodiscard]] bool Avx2Fma() const { return avx2 && fma; }
  // The AVX-512 subsets of Skylake-X and every later AVX-512 core (F, BW,
  // VL, DQ, CD): what OpenBLAS's SkylakeX core needs.
  [[nodiscard]] bool Avx512Core() const {
    return avx512f && avx512bw && avx512vl && avx512dq && avx512cd;
  }
  // "avx512f avx2 fma ..." of the extensions present, for logs and
  // benchmark JSON; "none" when none is.
  [[nodiscard]] std::string Names() const;
};

// This host's extensions, probed on the first call.
const CpuFeatures& CpuFeaturesOfThisHost();

}  // namespace ckpt::base

#endif  // CKPT_BASE_CPU_FEATURES_H_
