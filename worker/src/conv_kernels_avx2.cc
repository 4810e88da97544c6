// ckpt's convolution kernels for AVX2 with FMA (compiled with -mavx2 -mfma,
// worker/CMakeLists.txt; called only where the CPU has both), 8 floats per
// vector: the one-input-channel convolution's (8 columns; the weight gradient
// in blocks of 2 channels: 2 x 5 accumulators, 2 of the bias, 2 gradients and
// an input row in 16 vector registers) and the batch-lane convolution's (8
// samples; tiles that fit 16 registers).
#include <immintrin.h>

#include <cstdint>

#include "batch_lane_conv_impl.h"
#include "one_channel_conv_impl.h"

namespace ckpt::model::internal {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int64_t kLanes = 8;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float f) { return _mm256_set1_ps(f); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  // Load, into a register the compiler may not fold back into each use as a
  // memory operand (which would load the row once per channel again).
  static V LoadReg(const float* p) {
    V v = Load(p);
    asm("" : "+v"(v));
    return v;
  }
  static __m256i Mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V LoadN(const float* p, int64_t n) { return _mm256_maskload_ps(p, Mask(n)); }
  static void StoreN(float* p, V v, int64_t n) { _mm256_maskstore_ps(p, Mask(n), v); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  // rows[i] lane j <-> rows[j] lane i: pairs of floats, then of pairs, then
  // 128-bit halves.
  __attribute__((always_inline)) static void Transpose(V* rows) {
    V t[kLanes], u[kLanes];
#pragma GCC unroll 16
    for (int64_t i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(rows[2 * i], rows[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(rows[2 * i], rows[2 * i + 1]);
    }
#pragma GCC unroll 16
    for (int64_t i = 0; i < 2; ++i) {
      u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 16
    for (int64_t j = 0; j < 4; ++j) {
      rows[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
      rows[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
  }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static float Sum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

}  // namespace

const OneChannelConvKernels& OneChannelConvAvx2() {
  static const OneChannelConvKernels k{Avx2::kLanes, &OneChannelConvForwardOf<Avx2>,
                                       &OneChannelConvWeightGradOf<Avx2, 2>};
  return k;
}

const BatchLaneConvKernels& BatchLaneConvAvx2() {
  static const BatchLaneConvKernels k{Avx2::kLanes,
                                      16,
                                      &BatchLaneConvForwardOf<Avx2>,
                                      &BatchLaneConvDataGradOf<Avx2>,
                                      &BatchLaneConvWeightGradOf<Avx2>,
                                      &BatchLaneConvToLanes<Avx2>,
                                      &BatchLaneConvFromLanes<Avx2>};
  return k;
}

}  // namespace ckpt::model::internal
