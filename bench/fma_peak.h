// The machine's float32 peak from its own widest fused multiply-add: what a
// kernel could reach at best, as against what OpenBLAS's matrix product
// reaches (on an AVX-512 CPU that OpenBLAS 0.3.21 does not know, it runs its
// Haswell AVX2 kernels and measures about half the machine).
//
// Thread-safety: MeasureFmaPeak may be called from any thread; it starts and
// joins its own threads.
#ifndef CKPT_BENCH_FMA_PEAK_H_
#define CKPT_BENCH_FMA_PEAK_H_

#include <string>

namespace ckpt::bench {

struct FmaPeak {
  double gflops = 0;  // 2 FLOPs per lane per fused multiply-add, summed over threads
  std::string isa;    // "avx512f", "avx2+fma" or "scalar": the widest the CPU has
};

// Runs a loop of independent fused multiply-adds on `threads` threads for
// about `seconds` each and returns the best of three passes.
FmaPeak MeasureFmaPeak(int threads, double seconds);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_FMA_PEAK_H_
