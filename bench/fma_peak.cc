#include "fma_peak.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "ckpt/base/cpu_features.h"

namespace ckpt::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Enough independent accumulators to cover the FMA latency (4 cycles) on
// two ports: 12 chains keep every modern core's FMA units busy.
constexpr int kChains = 12;
// Multiply-adds per chain between clock reads.
constexpr int64_t kInner = 1 << 16;

// Each returns the FLOPs it ran; `sink` keeps the results alive.
__attribute__((target("avx512f"))) int64_t RunAvx512(double seconds, float* sink) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001F * static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999999F);
  const __m512 b = _mm512_set1_ps(1e-7F);
  int64_t fmas = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    for (int64_t i = 0; i < kInner; ++i) {
      // Unrolled, so the accumulators live in registers, not in memory.
#pragma GCC unroll 12
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    }
    fmas += kInner * kChains;
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  // A store, not _mm512_reduce_add_ps: GCC 12 warns inside that intrinsic.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  *sink = lanes[0];
  return fmas * 16 * 2;
}

__attribute__((target("avx2,fma"))) int64_t RunAvx2(double seconds, float* sink) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001F * static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999F);
  const __m256 b = _mm256_set1_ps(1e-7F);
  int64_t fmas = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    for (int64_t i = 0; i < kInner; ++i) {
#pragma GCC unroll 12
      for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    }
    fmas += kInner * kChains;
  }
  alignas(32) float lanes[8];
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  _mm256_store_ps(lanes, sum);
  *sink = lanes[0];
  return fmas * 8 * 2;
}

int64_t RunScalar(double seconds, float* sink) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = 0.001F * static_cast<float>(c);
  int64_t fmas = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    for (int64_t i = 0; i < kInner; ++i) {
#pragma GCC unroll 12
      for (float& x : acc) x = x * 0.999999F + 1e-7F;
    }
    fmas += kInner * kChains;
  }
  *sink = acc[0];
  return fmas * 2;
}

// One pass: every thread runs for `seconds`; GFLOP/s of all together.
double OnePass(int threads, double seconds, int64_t (*run)(double, float*)) {
  std::vector<float> sinks(static_cast<size_t>(threads));
  std::atomic<int64_t> flops{0};
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] { flops += run(seconds, &sinks[static_cast<size_t>(t)]); });
  }
  for (auto& th : pool) th.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  return elapsed > 0 ? static_cast<double>(flops.load()) / elapsed / 1e9 : 0;
}

}  // namespace

FmaPeak MeasureFmaPeak(int threads, double seconds) {
  const base::CpuFeatures& cpu = base::CpuFeaturesOfThisHost();
  FmaPeak peak;
  int64_t (*run)(double, float*) = RunScalar;
  peak.isa = "scalar";
  if (cpu.avx512f) {
    run = RunAvx512;
    peak.isa = "avx512f";
  } else if (cpu.Avx2Fma()) {
    run = RunAvx2;
    peak.isa = "avx2+fma";
  }
  for (int pass = 0; pass < 3; ++pass) {
    peak.gflops = std::max(peak.gflops, OnePass(std::max(1, threads), seconds / 3, run));
  }
  return peak;
}

}  // namespace ckpt::bench
